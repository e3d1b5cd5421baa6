//! Authentication tokens.
//!
//! * Each cluster's agent holds a secret token shared with the
//!   meta-scheduler (`Authorization: Bearer <token>`).
//! * `fleetctl` uses the admin token the same way.
//! * A stand-in job (`fleet-proxy`) holds a *job token* that grants access
//!   to that one job only: `hex(HMAC-SHA256(origin cluster token, "job:" + id))`.
//!   The origin agent mints it; the meta-scheduler recomputes it.
//! * A job running at a target holds a *checkpoint token* that lets it do
//!   one thing: report checkpoints of that one job
//!   (`Authorization: FleetCkpt <token>` on `POST /v1/jobs/{id}/checkpoints`):
//!   `hex(HMAC-SHA256(target cluster token, "ckpt:" + id))`. The target
//!   agent mints it; the meta-scheduler recomputes it with the token of the
//!   cluster the job is assigned to, so it stops working when the job
//!   leaves that cluster.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HTTP header scheme for job tokens.
pub const JOB_TOKEN_SCHEME: &str = "FleetJob";

/// The job token for `fleet_job_id`, minted with the origin cluster's secret.
pub fn job_token(cluster_secret: &str, fleet_job_id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(cluster_secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(b"job:");
    mac.update(fleet_job_id.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// HTTP header scheme for checkpoint tokens.
pub const CKPT_TOKEN_SCHEME: &str = "FleetCkpt";

/// The checkpoint token of `fleet_job_id` at a target, minted with that
/// cluster's secret. Distinct from [`job_token`] for the same secret and
/// id (another domain string), so neither stands in for the other.
pub fn ckpt_token(cluster_secret: &str, fleet_job_id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(cluster_secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(b"ckpt:");
    mac.update(fleet_job_id.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Constant-time comparison of a presented token with the expected one.
pub fn tokens_equal(presented: &str, expected: &str) -> bool {
    let (a, b) = (presented.as_bytes(), expected.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_tokens_differ_per_job_and_secret() {
        let a = job_token("s1", "j1");
        assert_eq!(a.len(), 64);
        assert_eq!(a, job_token("s1", "j1"));
        assert_ne!(a, job_token("s1", "j2"));
        assert_ne!(a, job_token("s2", "j1"));
        assert!(tokens_equal(&a, &job_token("s1", "j1")));
        assert!(!tokens_equal(&a, &job_token("s2", "j1")));
        assert!(!tokens_equal("ab", "abc"));
    }

    #[test]
    fn ckpt_tokens_are_per_job_and_not_job_tokens() {
        let c = ckpt_token("s1", "j1");
        assert_eq!(c.len(), 64);
        assert_eq!(c, ckpt_token("s1", "j1"));
        assert_ne!(c, ckpt_token("s1", "j2"));
        assert_ne!(c, ckpt_token("s2", "j1"));
        assert_ne!(c, job_token("s1", "j1"));
    }
}
