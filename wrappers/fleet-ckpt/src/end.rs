//! The end of a leased run (docs/failover.md, "A run that ended"): when
//! a run holds a job lease, `fleet-ckpt lease-exec` stays the batch
//! process and runs the job's script as its child, so that it sees the
//! script's exit status and can tell the meta-scheduler, on the lease's
//! own channel, that this run ended (`POST /v1/jobs/{id}/end`, the run's
//! checkpoint token, its epoch) before the batch step ends. A run that
//! said it ended is never moved off a silent cluster (it would run its
//! work again); the target agent's report stays the authority.
//!
//! The claim says whose end it was ([`EndCause`]): `lease-exec` and the
//! run's watchdog decide that once, through [`END_DECIDED`], so that an
//! end claimed as the script's own never followed a signal of the
//! watchdog's, even when the watchdog decided to stop the run just as the
//! script exited.
//!
//! `lease-exec` then exits as the script did (the same code, or the same
//! signal raised on itself), so Slurm records the job's own end.
//!
//! Signals: a signal Slurm sends to every process of the batch step
//! (`scancel`, `scancel --batch`, a suspend) reaches the script directly;
//! one sent to the batch process alone (`--signal=B:...`) reaches only
//! `lease-exec` and is passed on to the script. Which of the two it was
//! is read from a *sentinel*, a process of the step that blocks those
//! signals: a signal also pending there was sent to the whole step (it is
//! drained, not passed on); one not pending there within [`SENTINEL_WAIT`]
//! was sent to `lease-exec` alone.

use std::path::Path;
use std::time::Duration;

use fleet_api::api::{EndCause, RunEndClaim, RunEndReply};

use crate::lease::LeaseEnv;

/// The signals passed on to the script (every one a job may catch;
/// SIGCHLD, SIGCONT, SIGPIPE and the uncatchable ones are not).
pub const FORWARDED: [i32; 14] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGTERM,
    libc::SIGALRM,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGXCPU,
    libc::SIGPWR,
    libc::SIGURG,
    libc::SIGWINCH,
];

/// How long `lease-exec` looks for a signal it got in the sentinel's
/// pending set before it passes it on (Slurm signals a step's processes
/// one after another in one loop: well within this).
pub const SENTINEL_WAIT: Duration = Duration::from_millis(250);

/// How the script ended, from `waitpid`'s status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptEnd {
    Exited(i32),
    Signalled(i32),
}

impl ScriptEnd {
    pub fn from_wait_status(status: i32) -> Option<ScriptEnd> {
        if libc::WIFEXITED(status) {
            Some(ScriptEnd::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(ScriptEnd::Signalled(libc::WTERMSIG(status)))
        } else {
            None
        }
    }

    /// The claim sent for run `epoch`, whose end was `cause`'s (`None`:
    /// unknown, [`Whose::Unknown`]).
    /// `after_signal`: Slurm's kill of the whole step came first
    /// ([`step_kill`]).
    pub fn claim(self, epoch: u64, cause: Option<EndCause>, after_signal: Option<i32>) -> RunEndClaim {
        let (exit_code, signal) = match self {
            ScriptEnd::Exited(c) => (Some(c), None),
            ScriptEnd::Signalled(s) => (None, Some(s)),
        };
        RunEndClaim { epoch, exit_code, signal, cause, after_signal }
    }

    /// The end note for the target agent (`.fleet-run-ended`): `exit <c>`
    /// or `signal <s>`, then `after <k>` when Slurm's kill of the step came
    /// first, then the run (`job <id> restart <n> epoch <e> at <ms>`).
    pub fn note(self, after_signal: Option<i32>, run: &str) -> String {
        let how = match self {
            ScriptEnd::Exited(c) => format!("exit {c}"),
            ScriptEnd::Signalled(s) => format!("signal {s}"),
        };
        match after_signal {
            Some(k) => format!("{how} after {k} {run}\n"),
            None => format!("{how} {run}\n"),
        }
    }
}

/// The signal that starts Slurm's kill of a job's processes (SIGCONT and
/// SIGTERM to every process of each step, SIGKILL `KillWait` later): a
/// requeue, a node failure, a preemption, a cancellation.
pub const STEP_KILL: i32 = libc::SIGTERM;

/// How close to the script's end a SIGKILL of the sentinel counts as part
/// of the same kill. Slurm aborts a job it does not know (an orphan its
/// node reports as it registers) with SIGKILL to every process of the
/// step at once, one after another, the deepest first: a script whose
/// child was killed first can still exit before its own turn comes.
pub const KILL_NEAR: Duration = Duration::from_secs(1);

/// How long `lease-exec` watches the sentinel after the script exited
/// with no sign of a kill: the rest of an abort reaches the sentinel (or
/// `lease-exec`, which then notes nothing) within it.
pub const END_GRACE: Duration = Duration::from_millis(100);

/// Whether Slurm's kill of the whole step came before the script's end,
/// and by which signal: `drained`, the signals `lease-exec` found sent to
/// the whole step (pending at the sentinel too) while the script ran;
/// `sentinel_status`, the sentinel's `/proc/<pid>/status` read once the
/// script was reaped (Slurm signals a step's processes one after another:
/// a script that died of its child's kill, or whose trap exited at once,
/// can end before `lease-exec` is told, never before the kill started);
/// `sentinel_killed`, the sentinel (which nothing else signals) died of
/// SIGKILL within [`KILL_NEAR`] of the script's end.
pub fn step_kill(drained: &[i32], sentinel_status: Option<&str>, sentinel_killed: bool) -> Option<i32> {
    let pending = sentinel_status.and_then(|t| pending_in_status(t, STEP_KILL)) == Some(true);
    if drained.contains(&STEP_KILL) || pending {
        Some(STEP_KILL)
    } else {
        sentinel_killed.then_some(libc::SIGKILL)
    }
}

/// The file in the run's writable directory (`lease::run_dir`) that says
/// whose end a leased run's was: whoever creates it first decides.
/// `lease-exec` creates it (`script`) once it has reaped the script, the
/// watchdog (`lease ...`) once it decided to stop the run and before it
/// sends any signal. So an end `lease-exec` decided was the script's own
/// came before any signal of the watchdog's, even when the watchdog
/// decided a moment later; and a watchdog that finds the end decided
/// leaves `lease-exec` (the batch process, still reporting that end)
/// alone and writes no `.fleet-lease-stopped` note. `lease-exec` removes a
/// former run's before it starts the watchdog.
pub const END_DECIDED: &str = ".fleet-run-end-cause";

/// The outcome of trying to decide a run's end ([`decide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// This caller decided it.
    Won,
    /// Someone decided it first (or the job put something there: a job
    /// may write its directory, and then it only loses its own claim).
    Lost,
    /// The file could not be made (no writable directory).
    Unavailable,
}

/// Tries to decide the end of the run whose directory is `dir`, as `who`:
/// creates [`END_DECIDED`] if nothing is there (never through a link).
pub fn decide(dir: &Path, who: &str) -> Decided {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // O_CREAT|O_EXCL: atomic, and it fails on any existing name, a link included.
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(dir.join(END_DECIDED)) {
        Ok(mut f) => {
            let _ = writeln!(f, "{who}");
            Decided::Won
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Decided::Lost,
        Err(_) => Decided::Unavailable,
    }
}

/// Whose end it was, for `lease-exec`'s claim, from its try to decide it
/// once the script was reaped and, when that could not be tried, whether
/// the watchdog's note (`.fleet-lease-stopped`) is there: `None` when it
/// cannot tell (the meta-scheduler then treats the claim as an older
/// client's).
pub fn whose(decided: Decided, lease_stopped_note: bool) -> Option<EndCause> {
    match (decided, lease_stopped_note) {
        (Decided::Won, _) => Some(EndCause::Script),
        (Decided::Lost, _) | (Decided::Unavailable, true) => Some(EndCause::Lease),
        (Decided::Unavailable, false) => None,
    }
}

/// Whether signal `sig` is pending at a process, from its
/// `/proc/<pid>/status` (`ShdPnd`: sent to the process; `SigPnd`: to the
/// thread). `None`: the text has neither line.
pub fn pending_in_status(status: &str, sig: i32) -> Option<bool> {
    if !(1..=64).contains(&sig) {
        return Some(false);
    }
    let bit = 1u64 << (sig - 1);
    let mut seen = false;
    for key in ["ShdPnd:", "SigPnd:"] {
        if let Some(v) = status.lines().find_map(|l| l.strip_prefix(key)) {
            seen = true;
            if u64::from_str_radix(v.trim(), 16).is_ok_and(|m| m & bit != 0) {
                return Some(true);
            }
        }
    }
    seen.then_some(false)
}

/// What to do with a signal `lease-exec` caught `waited` ago, given
/// whether it is pending at the sentinel (`None`: no sentinel to ask).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The whole step got it: drain it at the sentinel, do not pass it on.
    Drain,
    /// Sent to the batch process alone: pass it on to the script.
    Forward,
    /// Not yet known: look again.
    Wait,
}

pub fn route(pending_at_sentinel: Option<bool>, waited: Duration) -> Route {
    match pending_at_sentinel {
        Some(true) => Route::Drain,
        None => Route::Forward,
        Some(false) if waited >= SENTINEL_WAIT => Route::Forward,
        Some(false) => Route::Wait,
    }
}

/// Sends the claim, retrying until `within` is spent (each try bounded).
/// `Ok(reply)`: the meta-scheduler answered (recorded or why not).
pub async fn report(
    http: &reqwest::Client,
    env: &LeaseEnv,
    claim: &RunEndClaim,
    within: Duration,
) -> anyhow::Result<RunEndReply> {
    use anyhow::Context;
    let t0 = std::time::Instant::now();
    let url = format!("{}/v1/jobs/{}/end", env.metasched.trim_end_matches('/'), env.job_id);
    let mut last = anyhow::anyhow!("not sent");
    while t0.elapsed() < within {
        let left = within.saturating_sub(t0.elapsed());
        let once = async {
            let token = crate::read_token_file(&env.token_file)?;
            let resp = http
                .post(&url)
                .timeout(left.min(Duration::from_secs(3)))
                .header(reqwest::header::AUTHORIZATION, format!("{} {token}", fleet_api::auth::CKPT_TOKEN_SCHEME))
                .json(claim)
                .send()
                .await
                .with_context(|| format!("POST {url}"))?;
            let status = resp.status();
            let bytes = resp.bytes().await.with_context(|| format!("POST {url}: reading the reply"))?;
            if status.is_client_error() {
                // Refused for good (the job is gone, the token spent): no retry.
                let msg =
                    serde_json::from_slice::<fleet_api::api::ApiError>(&bytes).map(|e| e.error).unwrap_or_default();
                return Ok(RunEndReply { recorded: false, reason: format!("{status}: {msg}") });
            }
            if !status.is_success() {
                anyhow::bail!("POST {url}: {status}");
            }
            serde_json::from_slice(&bytes).with_context(|| format!("POST {url}: the reply is not an end reply"))
        };
        match once.await {
            Ok(r) => return Ok(r),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(500).min(within.saturating_sub(t0.elapsed()))).await;
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_end_becomes_its_claim() {
        // waitpid statuses: exit code in bits 8..16, a signal in the low 7.
        assert_eq!(ScriptEnd::from_wait_status(0), Some(ScriptEnd::Exited(0)));
        assert_eq!(ScriptEnd::from_wait_status(3 << 8), Some(ScriptEnd::Exited(3)));
        assert_eq!(ScriptEnd::from_wait_status(libc::SIGTERM), Some(ScriptEnd::Signalled(libc::SIGTERM)));
        // Stopped (0x7f in the low byte): not an end.
        assert_eq!(ScriptEnd::from_wait_status(0x137f), None);
        assert_eq!(
            ScriptEnd::Exited(3).claim(2, Some(EndCause::Script), None),
            RunEndClaim {
                epoch: 2,
                exit_code: Some(3),
                signal: None,
                cause: Some(EndCause::Script),
                after_signal: None
            }
        );
        assert_eq!(
            ScriptEnd::Signalled(9).claim(1, None, None),
            RunEndClaim { epoch: 1, exit_code: None, signal: Some(9), cause: None, after_signal: None }
        );
        assert_eq!(
            ScriptEnd::Exited(5).claim(1, Some(EndCause::Script), Some(15)),
            RunEndClaim {
                epoch: 1,
                exit_code: Some(5),
                signal: None,
                cause: Some(EndCause::Script),
                after_signal: Some(15)
            }
        );
        let run = "job 42 restart 0 epoch 1 at 7";
        assert_eq!(ScriptEnd::Exited(5).note(None, run), "exit 5 job 42 restart 0 epoch 1 at 7\n");
        assert_eq!(ScriptEnd::Exited(5).note(Some(15), run), "exit 5 after 15 job 42 restart 0 epoch 1 at 7\n");
        assert_eq!(ScriptEnd::Signalled(9).note(Some(15), run), "signal 9 after 15 job 42 restart 0 epoch 1 at 7\n");
    }

    #[test]
    fn slurms_kill_of_the_step_is_known_before_or_after_the_script_ended() {
        let term_pending = "Name:\tfleet-ckpt\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n";
        let usr1_pending = "SigPnd:\t0000000000000000\nShdPnd:\t0000000000000200\n";
        // Drained while the script ran.
        assert_eq!(step_kill(&[libc::SIGUSR1, libc::SIGTERM], None, false), Some(libc::SIGTERM));
        // Still pending at the sentinel when the script was reaped.
        assert_eq!(step_kill(&[], Some(term_pending), false), Some(libc::SIGTERM));
        // Slurm's abort (SIGKILL to every process) reached the sentinel.
        assert_eq!(step_kill(&[], None, true), Some(libc::SIGKILL));
        assert_eq!(step_kill(&[libc::SIGTERM], None, true), Some(libc::SIGTERM));
        // Another signal to the whole step (scancel --signal=USR1 --full)
        // is no kill; nor is a SIGTERM sent to the batch process alone
        // (passed on, never drained), nor nothing at all.
        assert_eq!(step_kill(&[libc::SIGUSR1], Some(usr1_pending), false), None);
        assert_eq!(step_kill(&[], Some("SigPnd:\t0000000000000000\n"), false), None);
        assert_eq!(step_kill(&[], None, false), None);
    }

    #[test]
    fn whoever_decides_a_runs_end_first_decides_it() {
        let tmp = tempfile::tempdir().unwrap();
        let read = |d: &Path| std::fs::read_to_string(d.join(END_DECIDED)).unwrap();
        // The script ended first: its own end; the watchdog, deciding to
        // stop a moment later, finds it decided.
        let d = tmp.path().join("script-first");
        std::fs::create_dir(&d).unwrap();
        assert_eq!(decide(&d, "script"), Decided::Won);
        assert_eq!(decide(&d, "lease: its job lease ran out"), Decided::Lost);
        assert_eq!(read(&d), "script\n");
        // The watchdog decided first: whatever ended the script after, the
        // claim says the lease's.
        let d = tmp.path().join("watchdog-first");
        std::fs::create_dir(&d).unwrap();
        assert_eq!(decide(&d, "lease: this run is stale"), Decided::Won);
        assert_eq!(decide(&d, "script"), Decided::Lost);
        assert_eq!(read(&d), "lease: this run is stale\n");
        // Something the job put there (a link included, never followed):
        // decided, and the job loses only its own claim.
        let d = tmp.path().join("planted");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), d.join(END_DECIDED)).unwrap();
        assert_eq!(decide(&d, "script"), Decided::Lost);
        assert!(!tmp.path().join("elsewhere").exists());
        // No directory to decide in.
        assert_eq!(decide(&tmp.path().join("missing"), "script"), Decided::Unavailable);
        // The claim's cause from it (and from the note, when it cannot be tried).
        for (decided, note, want) in [
            (Decided::Won, false, Some(EndCause::Script)),
            (Decided::Won, true, Some(EndCause::Script)),
            (Decided::Lost, false, Some(EndCause::Lease)),
            (Decided::Lost, true, Some(EndCause::Lease)),
            (Decided::Unavailable, true, Some(EndCause::Lease)),
            (Decided::Unavailable, false, None),
        ] {
            assert_eq!(whose(decided, note), want, "{decided:?}, note {note}");
        }
    }

    #[test]
    fn a_signal_pending_at_the_sentinel_was_sent_to_the_whole_step() {
        let status = |shd: &str, sig: &str| {
            format!("Name:\tfleet-ckpt\nSigQ:\t0/1\nSigPnd:\t{sig}\nShdPnd:\t{shd}\nSigBlk:\t0\n")
        };
        // SIGTERM (15) is bit 14 (0x4000), SIGUSR1 (10) bit 9 (0x200).
        assert_eq!(pending_in_status(&status("0000000000004000", "0"), libc::SIGTERM), Some(true));
        assert_eq!(pending_in_status(&status("0000000000004000", "0"), libc::SIGUSR1), Some(false));
        assert_eq!(pending_in_status(&status("0", "0000000000000200"), libc::SIGUSR1), Some(true));
        assert_eq!(pending_in_status(&status("zz", "0"), libc::SIGUSR1), Some(false));
        assert_eq!(pending_in_status("Name:\tx\n", libc::SIGUSR1), None, "no such lines: unknown");
        assert_eq!(pending_in_status(&status("ffffffffffffffff", "0"), 0), Some(false));
        assert_eq!(pending_in_status(&status("ffffffffffffffff", "0"), 65), Some(false));
        // The route: drained when the whole step got it, passed on when
        // only the batch process did (after the wait), or at once
        // without a sentinel.
        let ms = Duration::from_millis;
        for (pending, waited, want) in [
            (Some(true), ms(0), Route::Drain),
            (Some(true), ms(900), Route::Drain),
            (Some(false), ms(0), Route::Wait),
            (Some(false), SENTINEL_WAIT - ms(1), Route::Wait),
            (Some(false), SENTINEL_WAIT, Route::Forward),
            (None, ms(0), Route::Forward),
        ] {
            assert_eq!(route(pending, waited), want, "{pending:?} after {waited:?}");
        }
    }
}
