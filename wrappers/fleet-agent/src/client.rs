//! The agent's HTTP client for the meta-scheduler (bearer token auth).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use fleet_api::api::{
    AgentWork, FenceReply, FenceRequest, FleetView, ForwardRequest, Heartbeat, JobRecord, OutputChunk, SignalRequest,
    SignalScope, StartConfirmation, StatusUpdate,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The meta-scheduler refused an update as conflicting with what it holds
/// (409): retrying the same update cannot succeed. `terminal`: the job is
/// already finished there.
#[derive(Debug, thiserror::Error)]
#[error("{what}: meta-scheduler answered 409 Conflict: {body}")]
pub struct Conflict {
    pub what: String,
    pub body: String,
    pub terminal: bool,
}

/// Longest a work request waits at the meta-scheduler for something to do.
pub const WORK_WAIT_MS: u64 = 20_000;

#[derive(Clone)]
pub struct MetaClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl MetaClient {
    /// `ca_file`: PEM bundle trusted for an https `base` (besides the
    /// system's roots).
    pub fn new(base: &str, token: &str, ca_file: Option<&std::path::Path>) -> Result<Self> {
        let mut builder =
            reqwest::Client::builder().timeout(Duration::from_secs(10)).connect_timeout(Duration::from_secs(3));
        if let Some(path) = ca_file {
            let pem = fleet_api::client::read_ca_bundle(path).map_err(anyhow::Error::msg)?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("parsing the CA bundle {}", path.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(MetaClient { http, base: base.trim_end_matches('/').to_string(), token: token.to_string() })
    }

    async fn send<T: DeserializeOwned>(&self, rb: reqwest::RequestBuilder, what: &str) -> Result<T> {
        let resp =
            rb.bearer_auth(&self.token).send().await.with_context(|| format!("{what}: meta-scheduler unreachable"))?;
        let status = resp.status();
        if status == reqwest::StatusCode::CONFLICT {
            let body = resp.text().await.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let terminal = v["terminal"].as_bool().unwrap_or(false);
            return Err(Conflict { what: what.to_string(), body: body.trim().to_string(), terminal }.into());
        }
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            bail!("{what}: meta-scheduler answered {status}: {}", body.trim());
        }
        resp.json().await.with_context(|| format!("{what}: bad JSON from the meta-scheduler"))
    }

    async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body), path).await
    }

    pub async fn heartbeat(&self, hb: &Heartbeat) -> Result<FleetView> {
        self.post("/v1/heartbeat", hb).await
    }

    /// Which of the runs this agent holds are stale (placed again since).
    pub async fn fence(&self, f: &FenceRequest) -> Result<FenceReply> {
        self.post("/v1/agent/fence", f).await
    }

    pub async fn forward(&self, f: &ForwardRequest) -> Result<JobRecord> {
        self.post("/v1/jobs", f).await
    }

    /// This cluster's work; waits up to `wait_ms` at the meta-scheduler
    /// when there is none yet (long poll: a new assignment, cancel or start
    /// request answers at once).
    pub async fn work(&self, wait_ms: u64) -> Result<AgentWork> {
        let rb = self
            .http
            .get(format!("{}/v1/agent/work", self.base))
            .query(&[("wait_ms", wait_ms)])
            .timeout(Duration::from_millis(wait_ms) + Duration::from_secs(10));
        self.send(rb, "/v1/agent/work").await
    }

    /// The origin agent's verdict on a stand-in's start request.
    pub async fn confirm_start(&self, id: &str, c: &StartConfirmation) -> Result<JobRecord> {
        self.post(&format!("/v1/jobs/{id}/confirm_start"), c).await
    }

    /// `POST /v1/jobs/{id}/checkpoints` as this cluster (the job's target).
    pub async fn report_checkpoint(
        &self,
        id: &str,
        r: &fleet_api::api::CheckpointReport,
    ) -> Result<fleet_api::api::Checkpoint> {
        self.post(&format!("/v1/jobs/{id}/checkpoints"), r).await
    }

    pub async fn status(&self, id: &str, s: &StatusUpdate) -> Result<JobRecord> {
        self.post(&format!("/v1/jobs/{id}/status"), s).await
    }

    /// Jobs forwarded from `origin` that may still be running somewhere.
    pub async fn active_jobs_from(&self, origin: &str) -> Result<Vec<JobRecord>> {
        let rb = self.http.get(format!("{}/v1/jobs", self.base)).query(&[("origin", origin), ("active", "true")]);
        self.send(rb, "/v1/jobs").await
    }

    /// Cancel a job forwarded from this cluster.
    pub async fn cancel(&self, id: &str) -> Result<JobRecord> {
        self.send(self.http.post(format!("{}/v1/jobs/{id}/cancel", self.base)), "cancel").await
    }

    /// Signal a job forwarded from this cluster (`scancel --signal` at its target).
    pub async fn signal(&self, id: &str, signal: &str, scope: SignalScope) -> Result<JobRecord> {
        let body = SignalRequest { signal: signal.to_string(), scope };
        self.post(&format!("/v1/jobs/{id}/signal"), &body).await
    }

    /// A running stand-in's new time limit, for the job where it runs;
    /// `raise`: one only an operator could make at home (`TimeLimitRequest::raise`).
    pub async fn time_limit(&self, id: &str, minutes: u32, raise: bool) -> Result<JobRecord> {
        let body = fleet_api::api::TimeLimitRequest { minutes, raise };
        self.post(&format!("/v1/jobs/{id}/time_limit"), &body).await
    }

    /// Send an output chunk. `Ok(Some(o))`: the meta-scheduler holds only
    /// `o` bytes of that stream (it lost a tail, e.g. in a crash before the
    /// data reached its disk) and wants the rest from offset `o`.
    pub async fn output(&self, id: &str, c: &OutputChunk) -> Result<Option<u64>> {
        let what = format!("/v1/jobs/{id}/output");
        let resp = self
            .http
            .post(format!("{}{what}", self.base))
            .json(c)
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("{what}: meta-scheduler unreachable"))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(None);
        }
        let body = resp.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::CONFLICT {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if let Some(o) = v["expected_offset"].as_u64().filter(|&o| o < c.offset) {
                return Ok(Some(o));
            }
        }
        bail!("{what}: meta-scheduler answered {status}: {}", body.trim())
    }
}
