//! The first placement rule, shared by the agent (answering the plugin
//! from its cached view) and the meta-scheduler (the final pick).
//!
//! Hard constraints: the GPU type and count fit in one cluster (per-node
//! count fits a node, total fits the cluster's usable GPUs of that type),
//! the cluster is healthy, `--fleet-to` is honoured, `--fleet=remote`
//! excludes the origin. Then: prefer the origin when it can hold the job;
//! otherwise the cluster with the most free matching GPUs.
//!
//! The full cost/data/topology engine (`fleet-engine`) refines the second
//! step; the hard constraints stay here so that both paths agree on what
//! is possible at all.

use crate::api::{ClusterSummary, FleetView, GpuPool};
use crate::{FleetMode, JobRequest};

/// Outcome of the rule.
#[derive(Clone, Debug, PartialEq)]
pub enum Placement {
    /// Run at the origin.
    Home { reason: String },
    /// Run at `target`.
    Remote { target: String, reason: String },
    /// No cluster can ever run it; `reason` names why, per cluster.
    Impossible { reason: String },
}

/// Why one cluster cannot take the job.
#[derive(Clone, Debug, PartialEq)]
pub struct Exclusion {
    pub cluster: String,
    pub reason: String,
}

/// Pools of `cluster` that match the job's GPU type (any type when untyped).
fn matching_pools<'a>(c: &'a ClusterSummary, job: &'a JobRequest) -> impl Iterator<Item = &'a GpuPool> {
    let want = job.gpu_type();
    c.gpus
        .iter()
        .filter(move |p| want.is_none_or(|w| p.gpu_type.eq_ignore_ascii_case(w)))
}

/// Can `c` ever hold `job` (capacity, not current load)? `Err` says why not.
pub fn fits(c: &ClusterSummary, job: &JobRequest) -> Result<(), String> {
    if !c.healthy {
        return Err(format!("no heartbeat for {:.0}s", c.heartbeat_age_s));
    }
    let total = job.total_gpus();
    let per_node = job.gpus_per_node();
    let nodes = job.min_nodes.unwrap_or(1).max(1);
    let want = job.gpu_type().unwrap_or("gpu");
    // The job must fit within one pool (one GPU type): a gang is not split
    // across types.
    let mut best: Option<(u32, u32, u32)> = None; // (total, max_per_node, nodes)
    for p in matching_pools(c, job) {
        if p.max_per_node >= per_node && p.nodes >= nodes && p.total >= total {
            return Ok(());
        }
        if best.is_none_or(|b| p.total > b.0) {
            best = Some((p.total, p.max_per_node, p.nodes));
        }
    }
    Err(match best {
        None => format!("has no {want} GPUs"),
        Some((t, m, n)) if m < per_node => {
            format!("has at most {m} {want} per node, job needs {per_node} (cluster total {t} on {n} nodes)")
        }
        Some((_, _, n)) if n < nodes => format!("has {n} nodes with {want}, job needs {nodes}"),
        Some((t, _, _)) => format!("has {t} {want} GPUs, job needs {total}"),
    })
}

fn free_matching(c: &ClusterSummary, job: &JobRequest) -> u32 {
    matching_pools(c, job).map(|p| p.free).max().unwrap_or(0)
}

/// Apply the rule. `job.origin` names the home cluster.
pub fn place(view: &FleetView, job: &JobRequest) -> (Placement, Vec<Exclusion>) {
    let mut excluded = Vec::new();
    let mut feasible: Vec<&ClusterSummary> = Vec::new();
    let allowed = |name: &str| job.fleet.to.is_empty() || job.fleet.to.iter().any(|t| t.eq_ignore_ascii_case(name));
    for c in &view.clusters {
        let reason = if !allowed(&c.name) {
            Some("not in --fleet-to".to_string())
        } else if job.fleet.mode == FleetMode::Remote && c.name == job.origin {
            Some("--fleet=remote excludes the origin".to_string())
        } else {
            fits(c, job).err()
        };
        match reason {
            Some(reason) => excluded.push(Exclusion { cluster: c.name.clone(), reason }),
            None => feasible.push(c),
        }
    }
    for t in &job.fleet.to {
        if !view.clusters.iter().any(|c| c.name.eq_ignore_ascii_case(t)) {
            excluded.push(Exclusion { cluster: t.clone(), reason: "unknown cluster".into() });
        }
    }
    if feasible.is_empty() {
        let why = excluded
            .iter()
            .map(|e| format!("{}: {}", e.cluster, e.reason))
            .collect::<Vec<_>>()
            .join("; ");
        let what = describe(job);
        return (
            Placement::Impossible { reason: format!("no cluster in the fleet can run {what} ({why})") },
            excluded,
        );
    }
    if let Some(home) = feasible.iter().find(|c| c.name == job.origin) {
        let home_free = free_matching(home, job);
        let others_free = feasible.iter().filter(|c| c.name != job.origin).map(|c| free_matching(c, job)).max();
        // Stay home when home can start it now, or nobody else can either.
        if home_free >= job.total_gpus() || others_free.is_none_or(|o| o < job.total_gpus()) {
            return (Placement::Home { reason: "the origin can run it".into() }, excluded);
        }
    }
    // Most free matching GPUs; ties broken by name for determinism.
    let best = feasible
        .iter()
        .filter(|c| c.name != job.origin)
        .max_by(|a, b| free_matching(a, job).cmp(&free_matching(b, job)).then_with(|| b.name.cmp(&a.name)))
        .expect("feasible holds a non-origin cluster when the origin was not chosen");
    let reason = format!("{} free matching GPUs at {}", free_matching(best, job), best.name);
    (Placement::Remote { target: best.name.clone(), reason }, excluded)
}

/// `view` with every cluster taken as healthy: what the fleet could run
/// once the silent clusters are back.
pub fn all_healthy(view: &FleetView) -> FleetView {
    let mut all = view.clone();
    all.clusters.iter_mut().for_each(|c| c.healthy = true);
    all
}

/// The agent's form of [`place`]: a job that only silent clusters (down,
/// restarting, not yet heard from) could run is not impossible but waits,
/// as Slurm users expect of a queue: `Remote` to the cluster that would
/// take it, with a reason saying so. The meta-scheduler queues it until a
/// cluster can take it. Truly impossible requests stay `Impossible`.
pub fn place_or_wait(view: &FleetView, job: &JobRequest) -> (Placement, Vec<Exclusion>) {
    let (p, excluded) = place(view, job);
    let Placement::Impossible { reason } = &p else { return (p, excluded) };
    match place(&all_healthy(view), job) {
        (Placement::Remote { target, .. }, _) => {
            let reason = format!("waiting for {target}, which has no recent heartbeat ({reason})");
            (Placement::Remote { target, reason }, excluded)
        }
        // Only the origin itself could run it: stay home, Slurm queues it.
        (Placement::Home { .. }, _) => (Placement::Home { reason: reason.clone() }, excluded),
        // Impossible even then: the capacity reasons say why.
        impossible => impossible,
    }
}

/// `gpu:h100:8 on 1 node(s)` style summary.
pub fn describe(job: &JobRequest) -> String {
    let t = job.gpu_type().map(|t| format!("{t}:")).unwrap_or_default();
    format!("gpu:{t}{} on {} node(s)", job.total_gpus(), job.min_nodes.unwrap_or(1).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FleetOptions, GpuRequest, GpuScope};

    fn cluster(name: &str, ty: &str, per_node: u32, nodes: u32, free: u32) -> ClusterSummary {
        ClusterSummary {
            name: name.into(),
            healthy: true,
            gpus: vec![GpuPool { gpu_type: ty.into(), total: per_node * nodes, free, max_per_node: per_node, nodes }],
            ..Default::default()
        }
    }

    fn lab() -> FleetView {
        FleetView {
            generated_at: 0.0,
            clusters: vec![cluster("alpha", "h100", 8, 2, 16), cluster("beta", "a100", 8, 2, 16)],
        }
    }

    fn job(origin: &str, ty: Option<&str>, n: u32, fleet: FleetOptions) -> JobRequest {
        JobRequest {
            origin: origin.into(),
            gpus: vec![GpuRequest { gpu_type: ty.map(Into::into), count: n, scope: GpuScope::Node }],
            fleet,
            ..Default::default()
        }
    }

    fn check(j: JobRequest, expected: &str) {
        let (p, _) = place(&lab(), &j);
        let got = match p {
            Placement::Home { .. } => "home".to_string(),
            Placement::Remote { target, .. } => target,
            Placement::Impossible { reason } => format!("impossible: {reason}"),
        };
        assert!(got.starts_with(expected), "got {got:?}, expected {expected:?}");
    }

    #[test]
    fn table() {
        let d = FleetOptions::default;
        check(job("beta", Some("h100"), 8, d()), "alpha");
        check(job("beta", Some("a100"), 4, d()), "home");
        check(job("beta", None, 8, d()), "home");
        check(job("beta", Some("H100"), 8, d()), "alpha");
        check(
            job("beta", Some("h100"), 512, d()),
            "impossible: no cluster in the fleet can run gpu:h100:512 on 1 node(s) (alpha: has at most 8 h100 per node",
        );
        check(job("beta", Some("b200"), 1, d()), "impossible");
        let to = |t: &str| FleetOptions { to: vec![t.into()], ..d() };
        check(job("beta", Some("a100"), 1, to("beta")), "home");
        check(job("beta", Some("h100"), 1, to("beta")), "impossible");
        check(job("beta", Some("h100"), 1, to("gamma")), "impossible");
        let remote = FleetOptions { mode: FleetMode::Remote, ..d() };
        check(job("beta", Some("a100"), 1, remote.clone()), "impossible");
        check(job("beta", None, 8, remote), "alpha");
    }

    #[test]
    fn busy_home_sends_work_where_gpus_are_free() {
        let mut v = lab();
        v.clusters.push(cluster("gamma", "a100", 8, 4, 32));
        v.clusters[1].gpus[0].free = 0;
        let (p, _) = place(&v, &job("beta", Some("a100"), 8, FleetOptions::default()));
        assert_eq!(p, Placement::Remote { target: "gamma".into(), reason: "32 free matching GPUs at gamma".into() });
    }

    #[test]
    fn unhealthy_clusters_are_excluded_with_reason() {
        let mut v = lab();
        v.clusters[0].healthy = false;
        v.clusters[0].heartbeat_age_s = 42.0;
        let (p, ex) = place(&v, &job("beta", Some("h100"), 8, FleetOptions::default()));
        assert!(matches!(p, Placement::Impossible { .. }));
        assert!(ex.iter().any(|e| e.cluster == "alpha" && e.reason == "no heartbeat for 42s"), "{ex:?}");
    }

    #[test]
    fn a_job_only_a_silent_cluster_could_run_waits_for_it() {
        let mut v = lab();
        v.clusters[0].healthy = false;
        v.clusters[0].heartbeat_age_s = 42.0;
        let d = FleetOptions::default;
        let (p, _) = place_or_wait(&v, &job("beta", Some("h100"), 8, d()));
        let Placement::Remote { target, reason } = p else { panic!("{p:?}") };
        assert_eq!(target, "alpha");
        assert!(reason.starts_with("waiting for alpha, which has no recent heartbeat"), "{reason}");
        // Impossible even with every cluster up: still refused, with the reason.
        let (p, _) = place_or_wait(&v, &job("beta", Some("h100"), 512, d()));
        assert!(matches!(&p, Placement::Impossible { reason } if reason.contains("at most 8 h100 per node")), "{p:?}");
        // Healthy answers are place()'s.
        assert_eq!(place_or_wait(&lab(), &job("beta", Some("h100"), 8, d())).0, place(&lab(), &job("beta", Some("h100"), 8, d())).0);
        // The origin silent in its own view: the job stays home.
        let mut v = lab();
        v.clusters[1].healthy = false;
        assert!(matches!(place_or_wait(&v, &job("beta", Some("a100"), 8, d())).0, Placement::Home { .. }));
    }
}
