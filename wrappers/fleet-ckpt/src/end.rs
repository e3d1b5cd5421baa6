//! The end of a leased run (docs/failover.md, "A run that ended"): when
//! a run holds a job lease, `fleet-ckpt lease-exec` stays the batch
//! process and runs the job's script as its child, so that it sees the
//! script's exit status and can tell the meta-scheduler, on the lease's
//! own channel, that this run ended (`POST /v1/jobs/{id}/end`, the run's
//! checkpoint token, its epoch) before the batch step ends. A run that
//! said it ended is never moved off a silent cluster (it would run its
//! work again); the target agent's report stays the authority.
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

use std::time::Duration;

use fleet_api::api::{RunEndClaim, RunEndReply};

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

    /// The claim sent for run `epoch`.
    pub fn claim(self, epoch: u64) -> RunEndClaim {
        match self {
            ScriptEnd::Exited(c) => RunEndClaim { epoch, exit_code: Some(c), signal: None },
            ScriptEnd::Signalled(s) => RunEndClaim { epoch, exit_code: None, signal: Some(s) },
        }
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
        assert_eq!(ScriptEnd::Exited(3).claim(2), RunEndClaim { epoch: 2, exit_code: Some(3), signal: None });
        assert_eq!(ScriptEnd::Signalled(9).claim(1), RunEndClaim { epoch: 1, exit_code: None, signal: Some(9) });
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
