//! The agent's lease on the fleet jobs it runs (self-fencing).
//!
//! Every successful exchange with the meta-scheduler renews the lease (a
//! heartbeat, a work poll, the fencing question of each watch pass, which
//! goes on while this cluster's own scheduler is down).
//! Cut off for longer than the lease (`LeaseMs`), the agent cancels every
//! fleet job it runs, because by then the meta-scheduler may have placed
//! them elsewhere (it never re-places them before the lease it was told
//! has run out). Once contact is back, the agent first asks which of its
//! runs are stale (`POST /v1/agent/fence`) and reports nothing before.
//!
//! Pure: the caller passes the time ([`std::time::Instant`]), so the
//! rules are tested without waiting.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Lease {
    lease: Option<Duration>,
    /// Last successful exchange (or the agent's start).
    last_ok: Instant,
    /// The lease ran out and the jobs were (or are being) stopped; cleared
    /// by the first exchange after it.
    expired: bool,
}

/// What the agent must do after [`Lease::tick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    Nothing,
    /// The lease just ran out: stop every fleet job this cluster runs.
    SelfFence {
        silent: Duration,
    },
}

impl Lease {
    pub fn new(lease: Option<Duration>, now: Instant) -> Lease {
        Lease { lease, last_ok: now, expired: false }
    }

    /// A successful exchange with the meta-scheduler.
    pub fn renew(&mut self, now: Instant) {
        self.last_ok = now;
        self.expired = false;
    }

    /// Called after a failed exchange (or periodically): self-fence once
    /// when the lease has just run out.
    pub fn tick(&mut self, now: Instant) -> LeaseAction {
        let Some(lease) = self.lease else { return LeaseAction::Nothing };
        let silent = now.saturating_duration_since(self.last_ok);
        if silent > lease && !self.expired {
            self.expired = true;
            return LeaseAction::SelfFence { silent };
        }
        LeaseAction::Nothing
    }

    /// Stopping the jobs failed (Slurm unreachable): try again next tick.
    pub fn retry_fence(&mut self) {
        self.expired = false;
    }

    /// The lease ran out and no exchange has succeeded since.
    pub fn expired(&self) -> bool {
        self.expired
    }

    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_runs_out_once_and_contact_renews_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut l = Lease::new(Some(s(30)), t0);
        // Within the lease: nothing, however often it is checked.
        assert_eq!(l.tick(t0 + s(10)), LeaseAction::Nothing);
        assert_eq!(l.tick(t0 + s(30)), LeaseAction::Nothing);
        // Past it: fence once.
        assert_eq!(l.tick(t0 + s(31)), LeaseAction::SelfFence { silent: s(31) });
        assert!(l.expired());
        assert_eq!(l.tick(t0 + s(40)), LeaseAction::Nothing);
        // Contact again: renewed, a later outage fences again.
        l.renew(t0 + s(50));
        assert!(!l.expired());
        assert_eq!(l.tick(t0 + s(79)), LeaseAction::Nothing);
        l.renew(t0 + s(79));
        assert_eq!(l.tick(t0 + s(100)), LeaseAction::Nothing);
        assert_eq!(l.tick(t0 + s(110)), LeaseAction::SelfFence { silent: s(31) });
    }

    #[test]
    fn without_a_lease_the_agent_never_fences() {
        let t0 = Instant::now();
        let mut l = Lease::new(None, t0);
        assert_eq!(l.tick(t0 + Duration::from_secs(86_400)), LeaseAction::Nothing);
        assert!(!l.expired());
    }
}
