//! Origin side: a forwarded job lives exactly as long as its stand-in.
//!
//! The proxy cancels the remote job when Slurm sends it SIGTERM. Every
//! other way a stand-in can end leaves the remote job running with nobody
//! to report to: the proxy SIGKILLed (OOM killer, `scancel -s KILL`,
//! KillWait exceeded), its node lost, the stand-in cancelled while still
//! pending (the proxy never ran), or a job rejected by slurmctld after
//! the plugin answered FORWARD. The origin agent therefore compares, every
//! few seconds, the meta-scheduler's active jobs from this site with the
//! stand-ins its controller knows, and cancels a job whose stand-in has
//! ended or vanished.
//!
//! A wrong cancel kills a user's running job, so a job is only cancelled
//! when it was found orphaned on two passes at least [`CONFIRM_S`] apart,
//! and only when both lists were read successfully.

use std::collections::HashMap;

use fleet_api::api::JobRecord;
use fleet_api::JobState;

use crate::backend::NativeJob;

/// How often the origin compares jobs and stand-ins.
pub const EVERY_S: f64 = 5.0;
/// An orphan must be seen this long before it is cancelled.
pub const CONFIRM_S: f64 = 8.0;
/// A job whose stand-in was never seen is given this long to appear
/// (slurmctld creates the record right after job_submit returns).
pub const APPEAR_GRACE_S: f64 = 60.0;

/// Why an active job from this site has no live stand-in, or `None`.
pub fn orphan_reason(job: &JobRecord, journaled: Option<u64>, stand_ins: &[NativeJob], now: f64) -> Option<String> {
    if job.state.is_terminal() || job.cancel_requested {
        return None;
    }
    // The stand-in is the Slurm job the agent confirmed at start, or, before
    // that, the one whose AdminComment (set by the plugin; users cannot set
    // it) carries this job's tag. Never a user-editable comment, never the
    // id a stand-in's token holder reported.
    let found = match journaled {
        Some(sid) => stand_ins.iter().find(|s| s.native_id == sid),
        None => stand_ins
            .iter()
            .find(|s| fleet_api::wire::parse_admin_tag(&s.admin_comment) == Some(job.fleet_job_id.as_str())),
    };
    match found {
        Some(s) if s.state.is_terminal() => {
            Some(format!("its stand-in, job {} at {}, ended ({})", s.native_id, job.origin, s.raw_state))
        }
        Some(_) => None,
        None if now - job.submitted_at < APPEAR_GRACE_S => None,
        None => Some(match journaled {
            Some(sid) => format!("its stand-in, job {sid} at {}, is gone", job.origin),
            None => format!("no stand-in for it exists at {}", job.origin),
        }),
    }
}

#[derive(Default)]
pub struct Suspects {
    since: HashMap<String, f64>,
}

impl Suspects {
    /// One pass: returns the jobs to cancel now, with the reason.
    /// `jobs`: active jobs from here with their journaled stand-in id.
    pub fn pass(
        &mut self,
        jobs: &[(JobRecord, Option<u64>)],
        stand_ins: &[NativeJob],
        now: f64,
    ) -> Vec<(String, String)> {
        let mut seen = HashMap::new();
        let mut cancel = Vec::new();
        for (job, journaled) in jobs {
            let Some(reason) = orphan_reason(job, *journaled, stand_ins, now) else {
                continue;
            };
            let since = self.since.get(&job.fleet_job_id).copied().unwrap_or(now);
            if now - since >= CONFIRM_S {
                cancel.push((job.fleet_job_id.clone(), reason));
            } else {
                seen.insert(job.fleet_job_id.clone(), since);
            }
        }
        // Whatever is not orphaned now starts over.
        self.since = seen;
        cancel
    }
}

/// `scontrol suspend` of a stand-in, passed on to its remote job.
///
/// Slurm 22.05 suspends a batch job by sending its processes SIGTSTP and
/// at once SIGSTOP (observed in the lab: a trap on TSTP runs only after
/// the resume), so the proxy is stopped before it can act, and resumes
/// it with SIGCONT (which the proxy itself forwards). The origin agent
/// therefore watches for stand-ins Slurm shows `SUSPENDED` and asks the
/// meta-scheduler to signal their remote job `STOP`; when the stand-in is
/// `RUNNING` again it sends `CONT` (a second CONT, after the proxy's, is
/// harmless).
#[derive(Default)]
pub struct Suspensions {
    stopped: std::collections::HashSet<String>,
}

impl Suspensions {
    /// One pass: the (job, signal) pairs to send now. `jobs`: active jobs
    /// from here with their journaled stand-in id.
    pub fn pass(&mut self, jobs: &[(JobRecord, Option<u64>)], stand_ins: &[NativeJob]) -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        let mut still = std::collections::HashSet::new();
        for (job, journaled) in jobs {
            let Some(s) = journaled.and_then(|sid| stand_ins.iter().find(|s| s.native_id == sid)) else {
                continue;
            };
            let id = &job.fleet_job_id;
            let at_target = matches!(job.state, JobState::Pending | JobState::Running | JobState::Assigned);
            let suspended = s.raw_state == "SUSPENDED";
            let was = self.stopped.contains(id);
            if suspended && at_target && !job.cancel_requested {
                if !was {
                    out.push((id.clone(), "STOP"));
                }
                still.insert(id.clone());
            } else if was && !suspended && s.raw_state == "RUNNING" {
                out.push((id.clone(), "CONT"));
            } else if was && !s.state.is_terminal() && !suspended {
                // Neither running nor suspended yet (completing): ask again next pass.
                still.insert(id.clone());
            }
        }
        self.stopped = still;
        out
    }
}

/// `scontrol update TimeLimit=` of a running stand-in, passed on to its
/// remote job. The limit a stand-in had when the origin agent confirmed
/// its start ([`TimeLimits::started`]; a pending stand-in's limit travels
/// with its start) is the job's; after an agent restart, the limit first
/// seen. A later lower one is sent to the target, where the target agent
/// sets it as the job's user, as Slurm lets an owner do. So is the first
/// limit of a stand-in that had none: Slurm at home lets its owner set any
/// (any limit is below none), so it is the owner's update, and the
/// target's Slurm judges it as one (a limit above the job's own is refused
/// there, as natively). A finite limit raised (only an operator at home can
/// raise a running job's limit) is sent as a raise, which the target agent
/// sets as itself, an operator there; a raise to UNLIMITED is not carried
/// (limits travel in minutes).
#[derive(Default)]
pub struct TimeLimits {
    /// The limit last passed on (or started with) per job, and when the job
    /// was last seen active.
    seen: std::collections::HashMap<String, (Option<u32>, f64)>,
}

/// A running stand-in's new time limit (minutes; `None`: unlimited).
#[derive(Debug, PartialEq, Eq)]
pub enum LimitChange {
    Lower(u32),
    Raise { from: Option<u32>, to: Option<u32> },
}

/// A stand-in's own time limit as the job's (minutes; `None`: none). A
/// stand-in is submitted without one (UNLIMITED), but Slurm 22.05's
/// backfill scheduler, starting a job whose limit and partition MaxTime
/// are both UNLIMITED, writes its planning horizon into the job: a year
/// (`YEAR_MINUTES`, seen in the lab as `TimeLimit=365-00:00:00` on
/// stand-ins backfill started). A year or more is therefore no limit: it
/// must neither become the remote job's limit at its start nor count as a
/// change afterwards.
pub fn stand_in_limit(s: &NativeJob) -> Option<u32> {
    s.time_limit_min.filter(|&m| m < YEAR_MINUTES)
}

/// Slurm's `YEAR_MINUTES` (365 days).
pub const YEAR_MINUTES: u32 = 365 * 24 * 60;

/// How long a job's limit is remembered after it was last seen active.
const LIMIT_MEMORY_S: f64 = 600.0;

impl TimeLimits {
    /// The stand-in of `id` was confirmed running with `limit`.
    pub fn started(&mut self, id: &str, limit: Option<u32>, now: f64) {
        self.seen.insert(id.to_string(), (limit, now));
    }

    pub fn pass(
        &mut self,
        jobs: &[(JobRecord, Option<u64>)],
        stand_ins: &[NativeJob],
        now: f64,
    ) -> Vec<(String, LimitChange)> {
        let mut out = Vec::new();
        for (job, journaled) in jobs {
            let Some(s) = journaled.and_then(|sid| stand_ins.iter().find(|s| s.native_id == sid)) else {
                continue;
            };
            let at_target = matches!(job.state, JobState::Pending | JobState::Running | JobState::Assigned);
            if s.raw_state != "RUNNING" || !at_target || job.cancel_requested {
                continue;
            }
            let id = &job.fleet_job_id;
            let limit = stand_in_limit(s);
            if let Some(&(before, _)) = self.seen.get(id) {
                if before != limit {
                    let lower = match (before, limit) {
                        (None, Some(n)) => Some(n),
                        (Some(b), Some(n)) if n < b => Some(n),
                        _ => None,
                    };
                    out.push((
                        id.clone(),
                        match lower {
                            Some(n) => LimitChange::Lower(n),
                            None => LimitChange::Raise { from: before, to: limit },
                        },
                    ));
                }
            }
            self.seen.insert(id.clone(), (limit, now));
        }
        self.seen.retain(|_, (_, at)| now - *at < LIMIT_MEMORY_S);
        out
    }
}

/// Jobs from `site` the meta-scheduler still counts as active.
pub fn active_from<'a>(site: &'a str, jobs: &'a [JobRecord]) -> impl Iterator<Item = &'a JobRecord> {
    jobs.iter().filter(move |j| j.origin == site && !j.state.is_terminal() && j.state != JobState::Lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, state: JobState, submitted_at: f64) -> JobRecord {
        JobRecord {
            fleet_job_id: id.into(),
            origin: "beta".into(),
            origin_job_id: None,
            target: Some("alpha".into()),
            remote_job_id: None,
            state,
            exit_code: None,
            signal: None,
            cancel_requested: false,
            reason: String::new(),
            stdout_len: 0,
            stderr_len: 0,
            output_complete: false,
            node_list: String::new(),
            submitted_at,
            updated_at: submitted_at,
            summary: String::new(),
            start_requested_at: None,
            requeues: 0,
            user: None,
            origin_restart: 0,
            stdout_base: 0,
            stderr_base: 0,
            epoch: 0,
            migrations: 0,
            requeue_notes: Vec::new(),
            time_limit_min: None,
        }
    }

    fn stand_in(id: u64, raw: &str, admin_comment: &str) -> NativeJob {
        let mut j = NativeJob::new(id, raw);
        j.admin_comment = admin_comment.into();
        j
    }

    #[test]
    fn a_running_stand_ins_new_limit_is_sent_when_lower_and_named_when_higher() {
        let stand_in = |state: &str, limit: Option<u32>| {
            let mut s = NativeJob::new(9, state);
            s.time_limit_min = limit;
            vec![s]
        };
        let jobs = vec![(job("beta-1", JobState::Running, 1.0), Some(9))];
        let mut t = TimeLimits::default();
        // Confirmed running without a limit of its own, then lowered before
        // the first pass saw it.
        t.started("beta-1", None, 0.0);
        assert_eq!(t.pass(&jobs, &stand_in("RUNNING", Some(10)), 1.0), [("beta-1".into(), LimitChange::Lower(10))]);
        assert!(t.pass(&jobs, &stand_in("RUNNING", Some(10)), 2.0).is_empty(), "sent once");
        assert_eq!(t.pass(&jobs, &stand_in("RUNNING", Some(3)), 3.0), [("beta-1".into(), LimitChange::Lower(3))]);
        assert_eq!(
            t.pass(&jobs, &stand_in("RUNNING", Some(30)), 4.0),
            [("beta-1".into(), LimitChange::Raise { from: Some(3), to: Some(30) })]
        );
        assert_eq!(
            t.pass(&jobs, &stand_in("RUNNING", None), 5.0),
            [("beta-1".into(), LimitChange::Raise { from: Some(30), to: None })]
        );
        assert_eq!(t.pass(&jobs, &stand_in("RUNNING", Some(5)), 6.0), [("beta-1".into(), LimitChange::Lower(5))]);
        // Unknown start (an agent restart): the first limit seen is the job's.
        let mut t = TimeLimits::default();
        assert!(t.pass(&jobs, &stand_in("PENDING", Some(10)), 0.0).is_empty());
        assert!(t.pass(&jobs, &stand_in("RUNNING", Some(10)), 1.0).is_empty(), "first sight running");
        // Not once the job is being cancelled or over.
        let mut cancelling = jobs.clone();
        cancelling[0].0.cancel_requested = true;
        assert!(t.pass(&cancelling, &stand_in("RUNNING", Some(1)), 2.0).is_empty());
        let done = vec![(job("beta-1", JobState::Completed, 1.0), Some(9))];
        assert!(t.pass(&done, &stand_in("RUNNING", Some(1)), 3.0).is_empty());
        // Backfill's year on a stand-in it started is no limit.
        let mut t = TimeLimits::default();
        t.started("beta-1", None, 0.0);
        assert!(t.pass(&jobs, &stand_in("RUNNING", Some(YEAR_MINUTES)), 1.0).is_empty());
        assert_eq!(stand_in_limit(&stand_in("RUNNING", Some(YEAR_MINUTES - 1))[0]), Some(YEAR_MINUTES - 1));
        // Forgotten LIMIT_MEMORY_S after it was last seen.
        assert!(t.pass(&[], &[], 3.0 + LIMIT_MEMORY_S).is_empty());
        assert!(t.seen.is_empty());
    }

    #[test]
    fn reasons() {
        let now = 1000.0;
        let s = [
            stand_in(7, "RUNNING", "fleet:beta-1"),
            stand_in(8, "FAILED", "fleet:beta-2"),
            stand_in(9, "CANCELLED", "fleet:beta-aaaa forwarded beta -> alpha: gpu:h100:8"),
            stand_in(10, "PENDING", "fleet:beta-bbbb"),
            stand_in(11, "COMPLETING", ""),
        ];
        assert_eq!(orphan_reason(&job("beta-1", JobState::Running, 0.0), Some(7), &s, now), None);
        assert_eq!(orphan_reason(&job("beta-1", JobState::Running, 0.0), Some(11), &s, now), None);
        let r = orphan_reason(&job("beta-2", JobState::Running, 0.0), Some(8), &s, now).unwrap();
        assert_eq!(r, "its stand-in, job 8 at beta, ended (FAILED)");
        let r = orphan_reason(&job("beta-3", JobState::Running, 0.0), Some(99), &s, now).unwrap();
        assert_eq!(r, "its stand-in, job 99 at beta, is gone");
        assert!(orphan_reason(&job("beta-aaaa", JobState::Held, 0.0), None, &s, now)
            .unwrap()
            .contains("ended (CANCELLED)"));
        assert_eq!(orphan_reason(&job("beta-bbbb", JobState::Held, 0.0), None, &s, now), None);
        assert_eq!(orphan_reason(&job("beta-cccc", JobState::Held, now - 5.0), None, &s, now), None);
        let r = orphan_reason(&job("beta-cccc", JobState::Held, now - 61.0), None, &s, now).unwrap();
        assert_eq!(r, "no stand-in for it exists at beta");
        assert_eq!(orphan_reason(&job("beta-2", JobState::Completed, 0.0), Some(8), &s, now), None);
        let mut j = job("beta-2", JobState::Running, 0.0);
        j.cancel_requested = true;
        assert_eq!(orphan_reason(&j, Some(8), &s, now), None);
    }

    #[test]
    fn a_decoy_with_the_tag_in_its_user_comment_is_not_a_stand_in() {
        // A user's own job in the proxy partition whose *comment* names
        // another user's job: only AdminComment counts, so the victim's
        // pending stand-in (tagged by the plugin) is found and kept.
        let mut decoy = stand_in(20, "CANCELLED", "");
        decoy.reason = "fleet:beta-victim".into();
        let victim = stand_in(21, "PENDING", "fleet:beta-victim");
        assert_eq!(orphan_reason(&job("beta-victim", JobState::Held, 0.0), None, &[decoy, victim], 1000.0), None);
    }

    #[test]
    fn an_orphan_is_cancelled_only_when_seen_twice_confirm_s_apart() {
        let s = [stand_in(8, "FAILED", "")];
        let live = [stand_in(8, "RUNNING", "")];
        let jobs = [(job("beta-2", JobState::Running, 0.0), Some(8))];
        let mut sus = Suspects::default();
        assert!(sus.pass(&jobs, &s, 100.0).is_empty());
        assert!(sus.pass(&jobs, &s, 105.0).is_empty());
        assert!(sus.pass(&jobs, &live, 106.0).is_empty());
        assert!(sus.pass(&jobs, &s, 110.0).is_empty());
        assert!(sus.pass(&jobs, &s, 117.0).is_empty());
        let c = sus.pass(&jobs, &s, 118.0);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, "beta-2");
    }

    #[test]
    fn a_suspended_stand_in_stops_its_job_and_a_resumed_one_continues_it() {
        let jobs = [(job("beta-1", JobState::Running, 0.0), Some(7)), (job("beta-2", JobState::Running, 0.0), Some(8))];
        let at = |a: &str, b: &str| [stand_in(7, a, "fleet:beta-1"), stand_in(8, b, "fleet:beta-2")];
        let mut s = Suspensions::default();
        assert!(s.pass(&jobs, &at("RUNNING", "RUNNING")).is_empty());
        assert_eq!(s.pass(&jobs, &at("SUSPENDED", "RUNNING")), [("beta-1".to_string(), "STOP")]);
        assert!(s.pass(&jobs, &at("SUSPENDED", "RUNNING")).is_empty(), "one STOP per suspension");
        assert_eq!(s.pass(&jobs, &at("RUNNING", "SUSPENDED")), [("beta-1".into(), "CONT"), ("beta-2".into(), "STOP")]);
        assert!(s.pass(&jobs, &at("RUNNING", "SUSPENDED")).is_empty());
        // Resumed and ended before the next pass: nothing to continue.
        assert!(s.pass(&jobs, &at("RUNNING", "CANCELLED")).is_empty());
        assert_eq!(s.pass(&jobs, &at("SUSPENDED", "RUNNING")), [("beta-1".to_string(), "STOP")]);
        // A job not (yet) at a target, or being cancelled, is not signalled.
        let mut held = job("beta-3", JobState::Held, 0.0);
        let mut cancelling = job("beta-4", JobState::Running, 0.0);
        cancelling.cancel_requested = true;
        held.origin_job_id = Some(9);
        let jobs = [(held, Some(9)), (cancelling, Some(10))];
        let s2 = [stand_in(9, "SUSPENDED", ""), stand_in(10, "SUSPENDED", "")];
        assert!(Suspensions::default().pass(&jobs, &s2).is_empty());
    }

    #[test]
    fn only_active_jobs_of_this_site() {
        let mut other = job("gamma-1", JobState::Running, 0.0);
        other.origin = "gamma".into();
        let jobs = [job("beta-1", JobState::Running, 0.0), job("beta-2", JobState::Completed, 0.0), other];
        let ids: Vec<_> = active_from("beta", &jobs).map(|j| j.fleet_job_id.as_str()).collect();
        assert_eq!(ids, ["beta-1"]);
    }
}
