//! The job's BEGIN mail, sent by the stand-in when the job starts at its
//! target (`--mail-begin`, `fleet_api::sbatch::proxy_mails_begin`).
//!
//! Slurm at home would send it when the stand-in starts, which is when the
//! job leaves, not when it begins: the plugin takes BEGIN out of the
//! stand-in's mail type and this sends it instead, the way slurmctld
//! does: the site's `MailProg` run as `MailProg -s <subject> <user>[@MailDomain]`,
//! the subject `Slurm Job_id=<id> Name=<name> Began, Queued time <time>`
//! (the stand-in's id, which is the one its user knows) and the variables
//! slurmctld sets for it and no others (Slurm 22.05's, observed in the lab:
//! `tests/control.rs` compares them with a native twin's). It runs as the job's user (the proxy's), who may
//! mail themselves; a failure is the proxy's own (logged on its stderr,
//! which is the job's), as slurmctld's are in its log.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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

/// Slurm's `secs2time_str`: `HH:MM:SS`, with `D-` in front past a day.
pub fn duration_text(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// The mail slurmctld would send at the job's start.
#[derive(Debug, PartialEq)]
pub struct Begin {
    pub job_id: u64,
    pub name: String,
    pub user: String,
    pub queued_s: u64,
    /// What slurmctld sets for `MailProg` besides the four the mail itself
    /// says (`SLURM_JOB_ID`, `SLURM_JOBID`, `SLURM_JOB_MAIL_TYPE`,
    /// `SLURM_JOB_STATE`, `SLURM_JOB_QUEUED_TIME`): see [`job_env`].
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

impl Begin {
    pub fn subject(&self) -> String {
        format!("Slurm Job_id={} Name={} Began, Queued time {}", self.job_id, self.name, duration_text(self.queued_s))
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
            ("SLURM_JOB_MAIL_TYPE".into(), "Began".into()),
            ("SLURM_JOB_STATE".into(), "RUNNING".into()),
            ("SLURM_JOB_QUEUED_TIME".into(), duration_text(self.queued_s)),
        ]);
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

/// Reads what the mail needs from Slurm (`scontrol show config`, and the
/// stand-in's record in `squeue --json`: its submit time, streams, ...)
/// and sends it. `now` is when the job was seen started;
/// `fallback_submit` the meta-scheduler's submission time.
pub fn send_begin(bin_dir: &Path, job_id: u64, now: i64, fallback_submit: i64) -> Result<(), String> {
    let run = |prog: &str, args: &[&str]| {
        let path = bin_dir.join(prog);
        let out = Command::new(&path)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", path.display()))?;
        Ok::<_, String>(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let site = parse_config(&run("scontrol", &["show", "config"])?).ok_or("scontrol show config names no MailProg")?;
    let listed: serde_json::Value =
        serde_json::from_str(&run("squeue", &["--json", "-j", &job_id.to_string()])?).unwrap_or_default();
    let job = listed["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["job_id"].as_u64() == Some(job_id)))
        .cloned()
        .unwrap_or_default();
    let submitted = job["submit_time"].as_i64().filter(|&t| t > 0).unwrap_or(fallback_submit);
    let var = |k: &str| std::env::var(k).ok();
    let begin = Begin {
        job_id,
        name: var("SLURM_JOB_NAME").unwrap_or_default(),
        user: var("SLURM_JOB_USER").or_else(|| var("USER")).unwrap_or_default(),
        queued_s: (now - submitted).max(0) as u64,
        job_env: job_env(var, &job),
    };
    if begin.user.is_empty() {
        return Err("the job's user is unknown (SLURM_JOB_USER is not set)".into());
    }
    begin.send(&site, Duration::from_secs(5))
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
        let b =
            Begin { job_id: 200042, name: "train x".into(), user: "alice".into(), queued_s: 93_784, job_env: vec![] };
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
        let b = Begin {
            job_id: 7,
            name: "n".into(),
            user: "alice".into(),
            queued_s: 65,
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
    }
}
