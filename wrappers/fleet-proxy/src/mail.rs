//! The mails a forwarded job's stand-in sends rather than Slurm at home
//! (`--mail-type`, `fleet_api::sbatch::proxy_mail_bits`), to the job's
//! user, when Slurm would have sent them for the job itself:
//! * BEGIN when the job starts at its target (Slurm would send it when the
//!   stand-in starts, which is when the job leaves, not when it begins);
//! * TIME_LIMIT_50/80/90 when the job has run that share of its limit
//!   there (the run's limit as its target reports it: its `--time`, that
//!   cluster's default without one, or an update there since; until then
//!   `--time-limit-min`; the stand-in's own limit when its user lowered
//!   it below): the stand-in has no limit of its own, so Slurm never would.
//!
//! The plugin takes these out of the stand-in's mail type. Each is sent
//! as slurmctld sends it: the site's `MailProg` run as `MailProg -s
//! <subject> <user>[@MailDomain]`, Slurm's subject (`Slurm Job_id=<id>
//! Name=<name> Began, Queued time <time>`, `... Reached 50% of time limit,
//! Run time <time>`; the stand-in's id, which is the one its user knows)
//! and the variables slurmctld sets for it and no others (Slurm 22.05's,
//! observed in the lab: `tests/control.rs` compares them with a native
//! twin's). It runs as the job's user (the proxy's), who may mail
//! themselves; a failure is the proxy's own (logged on its stderr, which is
//! the job's), as slurmctld's are in its log. Slurm looks at time limits
//! every 30 s and sends what is due then; the proxy sends each as it falls due.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What slurmctld needs to mail: `MailProg` and `MailDomain` from
/// `scontrol show config` (`(null)` is none).
#[derive(Debug, PartialEq)]
pub struct SiteMail {
    pub prog: PathBuf,
    pub domain: Option<String>,
}

pub fn parse_config(text: &str) -> Option<SiteMail> {
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let prog = value("MailProg").filter(|p| p.starts_with('/'))?;
    let domain = value("MailDomain").filter(|d| !d.is_empty() && d != "(null)");
    Some(SiteMail { prog: PathBuf::from(prog), domain })
}

pub use fleet_api::sbatch::duration_text;

/// What a mail says of the job's run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// BEGIN, after this long since submission.
    Began { queued_s: u64 },
    /// TIME_LIMIT_`percent`, after this long running.
    Reached { percent: u8, run_s: u64 },
}

/// One mail as slurmctld would send it.
#[derive(Debug, PartialEq)]
pub struct Mail {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub kind: Kind,
    /// What slurmctld sets for `MailProg` besides what the mail itself
    /// says (`SLURM_JOB_ID`, `SLURM_JOBID`, `SLURM_JOB_MAIL_TYPE`,
    /// `SLURM_JOB_STATE`, the queued or run time): see [`job_env`].
    pub job_env: Vec<(String, String)>,
}

/// Variables Slurm 22.05 gives `MailProg` that the stand-in's batch
/// environment holds with the same values (observed in the lab).
const FROM_BATCH_ENV: &[&str] = &[
    "SLURM_CLUSTER_NAME",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_JOB_GID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_UID",
    "SLURM_JOB_USER",
];

/// The job's variables for `MailProg`, as slurmctld sets them: from the
/// batch environment (`var`) and from `squeue --json`'s record of the job
/// (`job`): group, restart count, standard streams (`SLURM_JOB_STDERR`
/// only when the job named one), working directory and comment (when set).
pub fn job_env(var: impl Fn(&str) -> Option<String>, job: &serde_json::Value) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        FROM_BATCH_ENV.iter().filter_map(|k| var(k).map(|v| (k.to_string(), v))).collect();
    let text = |k: &str| job[k].as_str().filter(|v| !v.is_empty()).map(str::to_string);
    for (key, field) in [
        ("SLURM_JOB_GROUP", "group_name"),
        ("SLURM_JOB_STDIN", "standard_input"),
        ("SLURM_JOB_STDOUT", "standard_output"),
        ("SLURM_JOB_STDERR", "standard_error"),
        ("SLURM_JOB_WORK_DIR", "current_working_directory"),
        ("SLURM_JOB_COMMENT", "comment"),
    ] {
        if let Some(v) = text(field) {
            env.push((key.into(), v));
        }
    }
    if let Some(n) = job["restart_cnt"].as_u64() {
        env.push(("SLURM_JOB_RESTART_COUNT".into(), n.to_string()));
    }
    env
}

impl Mail {
    /// `SLURM_JOB_MAIL_TYPE`, and the subject's words after the name.
    fn what(&self) -> String {
        match self.kind {
            Kind::Began { .. } => "Began".into(),
            Kind::Reached { percent, .. } => format!("Reached {percent}% of time limit"),
        }
    }

    pub fn subject(&self) -> String {
        let time = match self.kind {
            Kind::Began { queued_s } => format!("Queued time {}", duration_text(queued_s)),
            Kind::Reached { run_s, .. } => format!("Run time {}", duration_text(run_s)),
        };
        format!("Slurm Job_id={} Name={} {}, {time}", self.job_id, self.name, self.what())
    }

    pub fn recipient(&self, site: &SiteMail) -> String {
        match &site.domain {
            Some(d) => format!("{}@{d}", self.user),
            None => self.user.clone(),
        }
    }

    /// `MailProg`'s whole environment: slurmctld gives it these alone.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = self.job_env.clone();
        env.extend([
            ("SLURM_JOB_ID".into(), self.job_id.to_string()),
            ("SLURM_JOBID".into(), self.job_id.to_string()),
            ("SLURM_JOB_MAIL_TYPE".into(), self.what()),
            ("SLURM_JOB_STATE".into(), "RUNNING".into()),
        ]);
        env.push(match self.kind {
            Kind::Began { queued_s } => ("SLURM_JOB_QUEUED_TIME".into(), duration_text(queued_s)),
            Kind::Reached { run_s, .. } => ("SLURM_JOB_RUN_TIME".into(), duration_text(run_s)),
        });
        env
    }

    /// Runs `MailProg` (at most `wait`, then left to end on its own).
    pub fn send(&self, site: &SiteMail, wait: Duration) -> Result<(), String> {
        let mut child = Command::new(&site.prog)
            .args(["-s", &self.subject(), &self.recipient(site)])
            .env_clear()
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("running MailProg {}: {e}", site.prog.display()))?;
        let t0 = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => return Err(format!("MailProg {} failed: {st}", site.prog.display())),
                Ok(None) if t0.elapsed() < wait => std::thread::sleep(Duration::from_millis(20)),
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("waiting for MailProg {}: {e}", site.prog.display())),
            }
        }
    }
}

/// When each of the proxy's mails falls due (pure: the caller supplies
/// what it saw, and sends what this returns).
#[derive(Debug)]
pub struct Mailer {
    /// `MAIL_JOB_*` bits still to send.
    left: u16,
    /// The job's limit as submitted (its `--time`), in minutes: the limit
    /// until its target reports the run's own.
    limit_min: Option<u32>,
    /// When the job was first seen started at its target.
    started: Option<Instant>,
}

/// TIME_LIMIT_`percent` as its `MAIL_JOB_*` bit (together
/// `fleet_api::sbatch::MAIL_TIME_LIMIT_FRACTIONS`).
const FRACTIONS: [(u8, u16); 3] = [(50, 1 << 7), (80, 1 << 6), (90, 1 << 5)];

impl Mailer {
    pub fn new(bits: u16, limit_min: Option<u32>) -> Mailer {
        Mailer { left: bits, limit_min, started: None }
    }

    /// Whether a time-limit mail is still to come (the caller then looks
    /// at the stand-in's own limit, which its user may have lowered).
    pub fn waits_on_the_limit(&self) -> bool {
        self.left & fleet_api::sbatch::MAIL_TIME_LIMIT_FRACTIONS != 0
    }

    /// The mails due now: `started` is whether the job has started at its
    /// target (it stays started); `target_limit_min` the run's limit there
    /// as its agent reports it (the job's `--time`, that cluster's default
    /// without one, or an update there since; `None` until reported), which
    /// replaces the submitted one, as Slurm counts shares of a job's limit
    /// as it is now; `own_limit_min` the stand-in's own limit if it has
    /// one (it counts when lower: the stand-in ends there).
    pub fn due(
        &mut self,
        started: bool,
        now: Instant,
        target_limit_min: Option<u32>,
        own_limit_min: Option<u32>,
    ) -> Vec<Due> {
        let mut due = Vec::new();
        if !started && self.started.is_none() {
            return due;
        }
        let t0 = *self.started.get_or_insert(now);
        if self.left & fleet_api::sbatch::MAIL_BEGIN != 0 {
            self.left &= !fleet_api::sbatch::MAIL_BEGIN;
            due.push(Due::Began);
        }
        let limit = match (target_limit_min.or(self.limit_min), own_limit_min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (Some(limit), run) = (limit, now.duration_since(t0)) else { return due };
        for (percent, bit) in FRACTIONS {
            if self.left & bit != 0 && run.as_secs_f64() >= f64::from(limit) * 60.0 * f64::from(percent) / 100.0 {
                self.left &= !bit;
                due.push(Due::Reached { percent, run_s: run.as_secs() });
            }
        }
        due
    }
}

/// A limit in minutes as `squeue --json` writes it: a number (22.05), or
/// `{"set": .., "infinite": .., "number": ..}` (23.02 on); `None` for
/// unlimited or unset.
pub fn limit_minutes(v: &serde_json::Value) -> Option<u32> {
    // INFINITE (0xffffffff) and NO_VAL (0xfffffffe) are no limit.
    fleet_api::slurm_json::number(v).and_then(|n| u32::try_from(n).ok()).filter(|m| *m < u32::MAX - 1)
}

/// A mail [`Mailer::due`] says to send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Due {
    Began,
    Reached { percent: u8, run_s: u64 },
}

/// The stand-in's record in `squeue --json` (its submit time, streams,
/// limit, ...), `Null` when Slurm does not show it.
pub fn stand_in(bin_dir: &Path, job_id: u64) -> Result<serde_json::Value, String> {
    let path = bin_dir.join("squeue");
    let out = Command::new(&path)
        .args(["--json", "-j", &job_id.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", path.display()))?;
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    Ok(listed["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["job_id"].as_u64() == Some(job_id)))
        .cloned()
        .unwrap_or_default())
}

/// Reads what the mail needs from Slurm (`scontrol show config`, and the
/// stand-in's record) and sends it. For BEGIN, `now` is when the job was
/// seen started and `fallback_submit` the meta-scheduler's submission time
/// (used when Slurm does not show the stand-in's).
pub fn send(bin_dir: &Path, job_id: u64, due: Due, now: i64, fallback_submit: i64) -> Result<(), String> {
    let scontrol = bin_dir.join("scontrol");
    let config = Command::new(&scontrol)
        .args(["show", "config"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", scontrol.display()))?;
    let site =
        parse_config(&String::from_utf8_lossy(&config.stdout)).ok_or("scontrol show config names no MailProg")?;
    let job = stand_in(bin_dir, job_id)?;
    let kind = match due {
        Due::Began => {
            let submitted = job["submit_time"].as_i64().filter(|&t| t > 0).unwrap_or(fallback_submit);
            Kind::Began { queued_s: (now - submitted).max(0) as u64 }
        }
        Due::Reached { percent, run_s } => Kind::Reached { percent, run_s },
    };
    let var = |k: &str| std::env::var(k).ok();
    let mail = Mail {
        job_id,
        name: var("SLURM_JOB_NAME").unwrap_or_default(),
        user: var("SLURM_JOB_USER").or_else(|| var("USER")).unwrap_or_default(),
        kind,
        job_env: job_env(var, &job),
    };
    if mail.user.is_empty() {
        return Err("the job's user is unknown (SLURM_JOB_USER is not set)".into());
    }
    mail.send(&site, Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mail_settings_come_from_scontrol_show_config() {
        let text = "Configuration data as of 2026-12-06T03:40:00\nMailDomain              = (null)\n\
                    MailProg                = /usr/bin/mail\nMaxArraySize = 1001\n";
        assert_eq!(parse_config(text), Some(SiteMail { prog: "/usr/bin/mail".into(), domain: None }));
        let text = "MailDomain = example.org\nMailProg = /usr/local/bin/smail\n";
        let site = parse_config(text).unwrap();
        assert_eq!(site.domain.as_deref(), Some("example.org"));
        assert_eq!(parse_config("MailProg = (null)\n"), None);
        assert_eq!(parse_config("MaxArraySize = 1\n"), None);
        let b = Mail {
            job_id: 200042,
            name: "train x".into(),
            user: "alice".into(),
            kind: Kind::Began { queued_s: 93_784 },
            job_env: vec![],
        };
        assert_eq!(b.subject(), "Slurm Job_id=200042 Name=train x Began, Queued time 1-02:03:04");
        assert_eq!(b.recipient(&site), "alice@example.org");
        assert_eq!(b.recipient(&parse_config("MailProg = /bin/mail\n").unwrap()), "alice");
    }

    #[test]
    fn times_are_slurms() {
        assert_eq!(duration_text(0), "00:00:00");
        assert_eq!(duration_text(3 * 3600 + 7), "03:00:07");
        assert_eq!(duration_text(86_400), "1-00:00:00");
    }

    #[test]
    fn the_jobs_variables_are_those_slurm_gives_mailprog() {
        let batch = |k: &str| match k {
            "SLURM_JOB_PARTITION" => Some("fleet".to_string()),
            "SLURM_JOB_USER" => Some("alice".to_string()),
            "SLURM_STEP_ID" | "SLURM_JOB_QOS" => Some("x".to_string()),
            _ => None,
        };
        let job = serde_json::json!({
            "group_name": "alice", "standard_input": "/dev/null", "standard_output": "/w/out.txt",
            "standard_error": "", "current_working_directory": "/w", "comment": "", "restart_cnt": 1,
        });
        let env = job_env(batch, &job);
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        // Only what Slurm sets: no SLURM_STEP_ID; no STDERR or COMMENT the job did not set.
        assert_eq!(
            keys,
            [
                "SLURM_JOB_PARTITION",
                "SLURM_JOB_USER",
                "SLURM_JOB_GROUP",
                "SLURM_JOB_STDIN",
                "SLURM_JOB_STDOUT",
                "SLURM_JOB_WORK_DIR",
                "SLURM_JOB_RESTART_COUNT"
            ]
        );
        assert!(env.contains(&("SLURM_JOB_RESTART_COUNT".into(), "1".into())));
        let job = serde_json::json!({"standard_error": "/w/err.txt", "comment": "mine"});
        let env = job_env(|_| None, &job);
        assert_eq!(
            env,
            [("SLURM_JOB_STDERR".into(), "/w/err.txt".into()), ("SLURM_JOB_COMMENT".into(), "mine".into())]
        );
    }

    #[test]
    fn the_mail_program_gets_slurms_arguments_and_variables() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("mail.log");
        let prog = dir.path().join("mailprog");
        std::fs::write(
            &prog,
            format!(
                "#!/bin/sh\nprintf '%s|%s|%s|%s|%s|%s|%s|%s\\n' \"$1\" \"$2\" \"$3\" \"$SLURM_JOB_ID\" \"$SLURM_JOB_MAIL_TYPE\" \"$SLURM_JOB_QUEUED_TIME\" \"$SLURM_JOB_GROUP\" \"$HOME$SLURM_STEP_ID\" >>{}\n",
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let b = Mail {
            job_id: 7,
            name: "n".into(),
            user: "alice".into(),
            kind: Kind::Began { queued_s: 65 },
            job_env: vec![("SLURM_JOB_GROUP".into(), "alice".into())],
        };
        b.send(&SiteMail { prog: prog.clone(), domain: None }, Duration::from_secs(5)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            // Nothing of the proxy's own environment ($HOME, SLURM_STEP_ID) reaches it.
            "-s|Slurm Job_id=7 Name=n Began, Queued time 00:01:05|alice|7|Began|00:01:05|alice|\n"
        );
        let err = b.send(&SiteMail { prog: "/nonexistent/mail".into(), domain: None }, Duration::from_secs(1));
        assert!(err.unwrap_err().contains("/nonexistent/mail"));
        // A time-limit mail: Slurm's words, and the run time instead of the queued time.
        let r = Mail { kind: Kind::Reached { percent: 80, run_s: 57 }, ..b };
        assert_eq!(r.subject(), "Slurm Job_id=7 Name=n Reached 80% of time limit, Run time 00:00:57");
        let env = r.env();
        assert!(env.contains(&("SLURM_JOB_MAIL_TYPE".into(), "Reached 80% of time limit".into())));
        assert!(env.contains(&("SLURM_JOB_RUN_TIME".into(), "00:00:57".into())));
        assert!(!env.iter().any(|(k, _)| k == "SLURM_JOB_QUEUED_TIME"));
    }

    #[test]
    fn each_mail_falls_due_once_when_the_job_begins_and_at_its_share_of_the_limit() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // BEGIN and TIME_LIMIT_50 and _90 of a 10-minute job.
        let mut m = Mailer::new(1 | (1 << 7) | (1 << 5), Some(10));
        assert!(m.due(false, at(0), None, None).is_empty(), "not before the job starts");
        assert_eq!(m.due(true, at(5), None, None), [Due::Began]);
        assert!(m.waits_on_the_limit());
        assert!(m.due(true, at(304), None, None).is_empty());
        assert_eq!(m.due(true, at(305), None, None), [Due::Reached { percent: 50, run_s: 300 }]);
        assert!(m.due(true, at(400), None, None).is_empty(), "each once");
        // The stand-in's own limit, lowered by its user to 6 minutes: 90 % of it.
        assert_eq!(m.due(false, at(5 + 324), None, Some(6)), [Due::Reached { percent: 90, run_s: 324 }]);
        assert!(!m.waits_on_the_limit());
        // A job that ran past every share before it was first seen: all at once.
        let mut m = Mailer::new(1 | (1 << 7) | (1 << 6), Some(1));
        assert_eq!(m.due(true, at(0), None, None), [Due::Began]);
        assert_eq!(
            m.due(true, at(60), None, None),
            [Due::Reached { percent: 50, run_s: 60 }, Due::Reached { percent: 80, run_s: 60 }]
        );
        // Without --time: the shares of the limit its target reports (its
        // default limit there), once reported.
        let mut m = Mailer::new(1 | (1 << 7) | (1 << 6), None);
        assert_eq!(m.due(true, at(0), None, None), [Due::Began]);
        assert!(m.due(true, at(100_000), None, None).is_empty(), "no limit known: none");
        let mut m = Mailer::new(1 << 7, None);
        assert!(m.due(true, at(0), None, None).is_empty());
        assert!(m.due(true, at(29), Some(1), None).is_empty());
        assert_eq!(m.due(true, at(30), Some(1), None), [Due::Reached { percent: 50, run_s: 30 }]);
        // An operator at home raised a limit the stand-in had (the user had
        // lowered it to 10 of the job's 20): the target's limit, now 40,
        // decides, not the job's --time; the stand-in's own still bounds it.
        let mut m = Mailer::new((1 << 7) | (1 << 6), Some(20));
        assert!(m.due(true, at(0), Some(40), Some(40)).is_empty());
        assert!(m.due(true, at(600), Some(40), Some(40)).is_empty(), "not at 50 % of --time");
        assert_eq!(m.due(true, at(1200), Some(40), Some(40)), [Due::Reached { percent: 50, run_s: 1200 }]);
        assert_eq!(m.due(true, at(1440), Some(40), Some(30)), [Due::Reached { percent: 80, run_s: 1440 }]);
    }

    #[test]
    fn limits_read_as_each_slurm_writes_them() {
        use serde_json::json;
        assert_eq!(limit_minutes(&json!(90)), Some(90));
        assert_eq!(limit_minutes(&json!(4294967295u64)), None, "22.05's INFINITE");
        assert_eq!(limit_minutes(&json!(4294967294u64)), None, "NO_VAL");
        assert_eq!(limit_minutes(&json!({"set": true, "infinite": false, "number": 90})), Some(90));
        assert_eq!(limit_minutes(&json!({"set": true, "infinite": true, "number": 0})), None);
        assert_eq!(limit_minutes(&json!({"set": false, "infinite": false, "number": 0})), None);
        assert_eq!(limit_minutes(&serde_json::Value::Null), None);
    }
}
