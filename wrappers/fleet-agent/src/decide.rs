//! The plugin's question, answered from the cached fleet view.
//!
//! LOCAL costs a lookup in memory (no I/O). FORWARD journals the job
//! first (so the answer survives an agent restart), then answers; the
//! meta-scheduler hears of it from the delivery loop.

use std::time::Instant;

use fleet_api::api::FleetView;
use fleet_api::placement::{self, Placement};
use fleet_api::wire::{ForwardPlan, PluginReply};
use fleet_api::{FleetMode, JobRequest};

use crate::config::AgentConfig;

/// The cached view and when it arrived.
#[derive(Default)]
pub struct CachedView {
    pub view: Option<FleetView>,
    pub at: Option<Instant>,
}

/// A FORWARD answer still to be journaled by the caller.
pub struct NewForward {
    pub id: String,
    pub target: String,
}

/// Decide; on FORWARD returns the plan and the journal entry to write.
pub fn decide(cfg: &AgentConfig, cache: &CachedView, job: &JobRequest) -> (PluginReply, Option<NewForward>) {
    let local = |reason: &str| (PluginReply::Local { reason: reason.to_string() }, None);
    if job.fleet.mode == FleetMode::Local || job.is_array {
        return local("kept local by request");
    }
    if job.origin != cfg.site {
        return (
            PluginReply::Reject { message: format!("request names origin {:?}, this is {:?}", job.origin, cfg.site) },
            None,
        );
    }
    let fresh = cache.at.is_some_and(|t| t.elapsed() <= cfg.view_max_age);
    let Some(view) = cache.view.as_ref().filter(|_| fresh) else {
        // Fail open: without a fresh view of the fleet, the job stays home.
        return local("no fresh fleet view; staying local");
    };
    match placement::place_or_wait(view, job).0 {
        Placement::Home { reason } => local(&reason),
        Placement::Impossible { reason } => (PluginReply::Reject { message: reason }, None),
        Placement::Remote { target, reason } => {
            // A job home can run is never refused for what keeps it from
            // leaving: it stays home instead (and the log says why).
            let cannot_leave =
                job.non_utf8_fields.first().map(|f| format!("field {f} is not valid UTF-8")).or_else(|| {
                    job.script
                        .is_none()
                        .then(|| format!("the script is larger than MaxScriptBytes={}", cfg.max_script_bytes))
                });
            if let Some(why) = cannot_leave.filter(|_| placement::origin_fits(view, job)) {
                return local(&format!("would go to {target}, but {why}: staying home"));
            }
            if let Some(f) = job.non_utf8_fields.first() {
                return (
                    PluginReply::Reject {
                        message: format!(
                            "cannot forward to {target}: field {f} is not valid UTF-8; fix it or use --fleet=local"
                        ),
                    },
                    None,
                );
            }
            if job.script.is_none() {
                let len = job.script_len.unwrap_or(0);
                return (
                    PluginReply::Reject {
                        message: format!(
                            "cannot forward to {target}: the script is {len} bytes, more than MaxScriptBytes={}; shrink it or use --fleet=local",
                            cfg.max_script_bytes
                        ),
                    },
                    None,
                );
            }
            let id = new_job_id(&cfg.site);
            let token = fleet_api::auth::job_token(&cfg.token, &id);
            let proxy_script = format!(
                "#!/bin/sh\n# Fleet stand-in: this job runs on cluster {target} (fleet job {id}).\n# Its output and exit code arrive here; scancel cancels it there.\n# The token is passed in the environment, never on the command line\n# (argv is world-readable in /proc; environ only to the job's user).\nunset FLEET_JOB_TOKEN_FILE\nFLEET_JOB_TOKEN='{token}' exec '{}' --job '{id}' --url '{}'{} --slurm-bin-dir '{}'{}\n",
                cfg.proxy_path.display(),
                cfg.metasched_url,
                cfg.metasched_ca_file.as_ref().map(|p| format!(" --ca-file '{}'", p.display())).unwrap_or_default(),
                cfg.slurm_bin.display(),
                fleet_api::sbatch::proxy_mail_args(job),
            );
            let admin_comment = format!(
                "fleet: forwarded {} -> {target} as {id}: {}{}{}{} ({reason})",
                cfg.site,
                placement::describe(job),
                job.time_limit_min.map(|t| format!(" time={t}m")).unwrap_or_default(),
                job.partition.as_deref().map(|p| format!(" partition={p}")).unwrap_or_default(),
                if job.env_dropped > 0 {
                    format!(" env: {} variables not carried", job.env_dropped)
                } else {
                    String::new()
                },
            );
            let plan = ForwardPlan {
                fleet_job_id: id.clone(),
                target: target.clone(),
                proxy_partition: cfg.proxy_partition.clone(),
                proxy_script,
                admin_comment,
                // The origin's reconciler finds a stand-in that never
                // started by the fleet id in its comment.
                comment: format!("fleet: {target} (waiting) {id}"),
                proxy_mail: fleet_api::sbatch::proxy_mail_bits(job),
            };
            (PluginReply::Forward(Box::new(plan)), Some(NewForward { id, target }))
        }
    }
}

/// `<site>-<12 hex>`: unique without coordination.
pub fn new_job_id(site: &str) -> String {
    let n: u64 = rand::random();
    format!("{site}-{:012x}", n & 0xffff_ffff_ffff)
}
