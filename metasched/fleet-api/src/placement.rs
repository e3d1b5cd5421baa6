//! The first placement rule, shared by the agent (answering the plugin
//! from its cached view) and the meta-scheduler (the final pick).
//!
//! Feasibility is decided per cluster the way slurmctld decides it, from
//! the whole request ([`Demand`]): the node range (`-N min[-max]`; unset =
//! as many nodes as the job needs), tasks, tasks per node, CPUs per task,
//! every GPU form (`--gpus` spread over the nodes, per node, per task, per
//! socket), memory (per node, per CPU, per GPU), CPUs per GPU and
//! `--constraint` features, checked node by node against the cluster's
//! node shapes (or, from an older meta-scheduler, its GPU pools).
//!
//! **Invariant:** a job the origin can run natively is never refused
//! here. Whatever the rule cannot see at the origin (unknown CPUs, memory
//! or features, a constraint too complex to evaluate) counts as
//! satisfiable there; the origin's health, `--fleet-max-price` and the
//! options only the origin can honour never exclude it; an origin missing
//! from the view keeps the job home. Whether a job the origin could run
//! leaves is the policy's call (`Remote` when home is busy and another
//! cluster has free GPUs now).
//!
//! Other clusters are held to what is known: unhealthy ones, those above
//! `--fleet-max-price` (or with no price known), those whose node
//! features are unknown when the job has a `--constraint`, and all of
//! them when the job uses an option no other cluster can honour
//! ([`JobRequest::not_carried`]), are excluded with the reason.
//!
//! The full cost/data/topology engine (`fleet-engine`) refines the choice
//! among feasible clusters; the hard constraints stay here so that both
//! paths agree on what is possible at all.

use crate::api::{ClusterSummary, FleetView, GpuPool, GpuQuota, NodeShape};
use crate::{FleetMode, FleetOptions, GpuScope, JobRequest};

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

/// The resource request, normalised as slurmctld reads `job_desc`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// GPU type, `None` = any (nodes of several types may be mixed).
    pub gpu_type: Option<String>,
    pub gpus_per_job: u32,
    /// Per node: `--gpus-per-node`/`--gres` plus `--gpus-per-socket`
    /// (counted as one socket per node: the least a node can offer).
    pub gpus_per_node: u32,
    pub gpus_per_task: u32,
    pub min_nodes: u32,
    /// `None` = no upper bound but the cluster's size.
    pub max_nodes: Option<u32>,
    /// `None` = one task per node (Slurm's default for a batch job).
    pub tasks: Option<u32>,
    /// Exactly this many tasks per node when `tasks` is unset, at most
    /// this many when it is set (Slurm's rule).
    pub tasks_per_node: Option<u32>,
    pub cpus_per_task: u32,
    pub cpus_per_gpu: u32,
    /// MiB; 0 = no memory request (or `--mem=0`: all of each node).
    pub mem_per_node: u64,
    pub mem_per_cpu: u64,
    pub mem_per_gpu: u64,
    pub constraint: Option<Constraint>,
}

/// `--constraint`, as far as the rule evaluates it.
#[derive(Clone, Debug, PartialEq)]
pub enum Constraint {
    /// `a&b`, `a,b`: every feature on each node.
    All(Vec<String>),
    /// `a|b`: any one of them on each node.
    Any(Vec<String>),
    /// Brackets, counts, node-count operators: not evaluated here (the
    /// origin's slurmctld judges it; other clusters are not offered it).
    Complex(String),
}

impl Constraint {
    pub fn parse(s: &str) -> Option<Constraint> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        let simple =
            |f: &str| !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        let split = |sep: &[char]| s.split(sep).map(|f| f.trim().to_string()).collect::<Vec<_>>();
        if !s.contains('|') {
            let all = split(&['&', ',']);
            if all.iter().all(|f| simple(f)) {
                return Some(Constraint::All(all));
            }
        } else if !s.contains(['&', ',']) {
            let any = split(&['|']);
            if any.iter().all(|f| simple(f)) {
                return Some(Constraint::Any(any));
            }
        }
        Some(Constraint::Complex(s.to_string()))
    }

    /// `Some(ok)` when decidable against `features`.
    fn holds(&self, features: &[String]) -> Option<bool> {
        let has = |f: &String| features.iter().any(|g| g.eq_ignore_ascii_case(f));
        match self {
            Constraint::All(fs) => Some(fs.iter().all(has)),
            Constraint::Any(fs) => Some(fs.iter().any(has)),
            Constraint::Complex(_) => None,
        }
    }
}

impl Demand {
    pub fn of(job: &JobRequest) -> Demand {
        let sum =
            |scope: GpuScope| job.gpus.iter().filter(|g| g.scope == scope).fold(0u32, |a, g| a.saturating_add(g.count));
        let min_nodes = job.min_nodes.unwrap_or(1).max(1);
        Demand {
            gpu_type: job.gpu_type().map(str::to_string),
            gpus_per_job: sum(GpuScope::Job),
            gpus_per_node: sum(GpuScope::Node).saturating_add(sum(GpuScope::Socket)),
            gpus_per_task: sum(GpuScope::Task),
            min_nodes,
            max_nodes: match (job.min_nodes, job.max_nodes) {
                (_, Some(m)) => Some(m.max(min_nodes)),
                (Some(_), None) => None,
                (None, None) => None,
            },
            tasks: job.num_tasks.filter(|&t| t > 0),
            tasks_per_node: job.ntasks_per_node.filter(|&t| t > 0),
            cpus_per_task: job.cpus_per_task.unwrap_or(1).max(1),
            cpus_per_gpu: job.cpus_per_gpu.unwrap_or(0),
            mem_per_node: job.mem_per_node_mb.unwrap_or(0),
            mem_per_cpu: job.mem_per_cpu_mb.unwrap_or(0),
            mem_per_gpu: job.mem_per_gpu_mb.unwrap_or(0),
            constraint: job.constraint.as_deref().and_then(Constraint::parse),
        }
    }

    fn wants_gpus(&self) -> bool {
        self.gpus_per_job > 0 || self.gpus_per_node > 0 || self.gpus_per_task > 0
    }
}

/// One group of identical nodes, with "unknown" as `None` (borrowed from
/// the cluster's summary: the submit hook places jobs with it, where every
/// allocation costs).
#[derive(Clone, Debug, PartialEq)]
struct Nodes<'a> {
    gpu_type: Option<&'a str>,
    gpus: u32,
    cpus: Option<u64>,
    mem: Option<u64>,
    features: Option<&'a [String]>,
    count: u32,
}

/// The cluster's nodes: its shapes, or (older meta-scheduler) nodes made
/// up from its GPU pools: `nodes` nodes holding `total` GPUs, as many as
/// possible with `max_per_node`.
fn nodes_of(c: &ClusterSummary) -> Vec<Nodes<'_>> {
    if !c.nodes.is_empty() {
        return c
            .nodes
            .iter()
            .filter(|n| n.count > 0)
            .map(|n| Nodes {
                gpu_type: n.gpu_type.as_deref(),
                gpus: n.gpus,
                cpus: (n.cpus > 0).then_some(n.cpus.into()),
                mem: (n.memory_mb > 0).then_some(n.memory_mb),
                features: n.features.as_deref(),
                count: n.count,
            })
            .collect();
    }
    let mut out = Vec::new();
    for p in &c.gpus {
        if p.nodes == 0 || p.max_per_node == 0 {
            continue;
        }
        let full = (p.total / p.max_per_node).min(p.nodes);
        let rest = p.total - full * p.max_per_node;
        let mut left = p.nodes - full;
        let mut push = |gpus: u32, count: u32| {
            if count > 0 && gpus > 0 {
                out.push(Nodes {
                    gpu_type: Some(p.gpu_type.as_str()),
                    gpus,
                    cpus: None,
                    mem: None,
                    features: None,
                    count,
                });
            }
        };
        push(p.max_per_node, full);
        if rest > 0 && left > 0 {
            push(rest.min(p.max_per_node), 1);
            left -= 1;
        }
        push(1, left);
    }
    out
}

/// Group per-node facts into [`NodeShape`]s (the meta-scheduler builds
/// `ClusterSummary::nodes` with it from the usable nodes of a heartbeat).
pub fn node_shapes<'a>(
    nodes: impl IntoIterator<Item = (Option<&'a str>, u32, u32, u64, Option<&'a [String]>)>,
) -> Vec<NodeShape> {
    let mut out: Vec<NodeShape> = Vec::new();
    for (ty, gpus, cpus, mem, features) in nodes {
        let mut features = features.map(<[String]>::to_vec);
        if let Some(f) = features.as_mut() {
            f.sort();
        }
        let shape = NodeShape { gpu_type: ty.map(str::to_string), gpus, cpus, memory_mb: mem, features, count: 0 };
        match out.iter_mut().find(|s| NodeShape { count: 0, ..(*s).clone() } == shape) {
            Some(s) => s.count += 1,
            None => out.push(NodeShape { count: 1, ..shape }),
        }
    }
    out
}

/// Is `gpu_type` a MIG profile (`1g.10gb`, `a100_3g.40gb`): slices of a GPU?
pub fn is_mig_profile(gpu_type: &str) -> bool {
    let t = gpu_type.to_ascii_lowercase();
    let last = t.rsplit(['_', '-']).next().unwrap_or("");
    last.split_once("g.").is_some_and(|(g, mem)| {
        !g.is_empty()
            && g.bytes().all(|b| b.is_ascii_digit())
            && mem.strip_suffix("gb").is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Does a request for `want` (any GPU when `None`) take GPUs of type `have`
/// away from home? MIG slices only when named: a slice is a fraction of a
/// GPU, and at a Kubernetes site (MIG "mixed" strategy) a pod asking for
/// `nvidia.com/gpu` cannot use one at all. At the origin Slurm's own
/// matching stands (any type for an untyped request).
fn type_matches(want: Option<&str>, have: &str, at_origin: bool) -> bool {
    match want {
        Some(w) => w.eq_ignore_ascii_case(have),
        None => at_origin || !is_mig_profile(have),
    }
}

/// What one node of a group can give the job: `None` when it cannot hold
/// its share at all (the reason), else (most tasks, GPUs for `--gpus`).
fn node_capacity(n: &Nodes<'_>, d: &Demand, at_origin: bool) -> Result<(u64, u64), String> {
    let ty = n.gpu_type.unwrap_or("no");
    if d.wants_gpus() {
        match (&d.gpu_type, n.gpu_type) {
            (_, None) => return Err("no GPUs".into()),
            (Some(w), Some(t)) if !w.eq_ignore_ascii_case(t) => return Err(format!("{t}, not {w}")),
            (None, Some(t)) if !type_matches(None, t, at_origin) => {
                return Err(format!("{t} MIG slices, only for requests naming {t}"))
            }
            _ => {}
        }
    }
    if let Some(c) = &d.constraint {
        match n.features.map(|f| c.holds(f)) {
            Some(Some(true)) => {}
            Some(Some(false)) => return Err("lacks the --constraint features".into()),
            // Unknown features or a constraint too complex to evaluate:
            // the origin's slurmctld judges it; elsewhere it is not offered.
            _ if at_origin => {}
            Some(None) => return Err(format!("--constraint={} is too complex to check here", constraint_text(c))),
            None => return Err("node features unknown, cannot check --constraint".into()),
        }
    }
    let gpus = u64::from(n.gpus);
    let per_node = u64::from(d.gpus_per_node);
    if gpus < per_node {
        return Err(format!("{gpus} {ty} GPUs per node, job needs {per_node} per node"));
    }
    let inf = u64::MAX / 4;
    let cpus = n.cpus.unwrap_or(inf);
    let mem = n.mem.unwrap_or(inf);
    if d.mem_per_node > mem {
        return Err(format!("{mem} MiB per node, job needs --mem={}M", d.mem_per_node));
    }
    if d.mem_per_gpu.saturating_mul(per_node) > mem {
        return Err(format!("{mem} MiB per node, job needs {} MiB for {per_node} GPUs", d.mem_per_gpu * per_node));
    }
    // A node holding any of the job's GPUs holds `--mem-per-gpu` for it.
    if d.wants_gpus() && d.mem_per_gpu > mem {
        return Err(format!("{mem} MiB per node, job needs --mem-per-gpu={}M for each GPU", d.mem_per_gpu));
    }
    // The fewest CPUs a node of the job gets: one task's (or the tasks
    // per node it asks for), and its GPUs' `--cpus-per-gpu`; each holds
    // `--mem-per-cpu`.
    if d.mem_per_cpu > 0 {
        let tasks = match (d.tasks, d.tasks_per_node) {
            (None, Some(tpn)) => u64::from(tpn),
            _ => 1,
        };
        let min_cpus =
            (u64::from(d.cpus_per_task).saturating_mul(tasks)).max(u64::from(d.cpus_per_gpu).saturating_mul(per_node));
        if d.mem_per_cpu.saturating_mul(min_cpus) > mem {
            return Err(format!(
                "{mem} MiB per node, job needs --mem-per-cpu={}M × {min_cpus} CPU(s) = {} MiB per node",
                d.mem_per_cpu,
                d.mem_per_cpu.saturating_mul(min_cpus)
            ));
        }
    }
    if u64::from(d.cpus_per_gpu).saturating_mul(per_node) > cpus {
        return Err(format!(
            "{cpus} CPUs per node, job needs {} for {per_node} GPUs",
            u64::from(d.cpus_per_gpu) * per_node
        ));
    }
    // Tasks this node can hold.
    let cpt = u64::from(d.cpus_per_task);
    let mut tasks = cpus / cpt;
    if d.mem_per_cpu > 0 {
        tasks = tasks.min(mem / d.mem_per_cpu.saturating_mul(cpt));
    }
    if d.gpus_per_task > 0 {
        let gt = u64::from(d.gpus_per_task);
        tasks = tasks.min((gpus - per_node) / gt);
        if d.mem_per_gpu > 0 {
            tasks = tasks.min((mem - d.mem_per_gpu * per_node) / d.mem_per_gpu.saturating_mul(gt));
        }
        if d.cpus_per_gpu > 0 {
            tasks = tasks.min(cpus / u64::from(d.cpus_per_gpu).saturating_mul(gt));
        }
    }
    if let Some(tpn) = d.tasks_per_node {
        tasks = tasks.min(tpn.into());
    }
    let need_tasks = match (d.tasks, d.tasks_per_node) {
        (None, Some(tpn)) => u64::from(tpn),
        _ => 1,
    };
    if tasks < need_tasks {
        let cpus_s = n.cpus.map(|c| format!("{c} CPUs")).unwrap_or_else(|| "its CPUs".into());
        return Err(if d.gpus_per_task > 0 && (gpus - per_node) / u64::from(d.gpus_per_task) < need_tasks {
            format!(
                "{gpus} {ty} GPUs per node, job needs {} for {need_tasks} task(s)",
                u64::from(d.gpus_per_task) * need_tasks
            )
        } else {
            format!(
                "{cpus_s} and {} MiB per node hold {tasks} task(s) of {cpt} CPU(s), job needs {need_tasks} per node",
                n.mem.map(|m| m.to_string()).unwrap_or("?".into())
            )
        });
    }
    // GPUs this node can give to `--gpus` beyond its per-node share.
    let mut spare = gpus - per_node;
    // (Both divisions were checked above to leave at least `per_node`.)
    if let Some(g) = mem.checked_div(d.mem_per_gpu) {
        spare = spare.min(g.saturating_sub(per_node));
    }
    if let Some(g) = cpus.checked_div(u64::from(d.cpus_per_gpu)) {
        spare = spare.min(g.saturating_sub(per_node));
    }
    Ok((tasks, spare))
}

fn constraint_text(c: &Constraint) -> String {
    match c {
        Constraint::All(f) => f.join("&"),
        Constraint::Any(f) => f.join("|"),
        Constraint::Complex(s) => s.clone(),
    }
}

/// Sum of the `n` largest values of `(value, count)` groups sorted by value, largest first.
fn top_sum(groups: &[(u64, u32)], n: u32) -> u64 {
    let mut left = n;
    let mut sum = 0u64;
    for &(v, c) in groups {
        let take = c.min(left);
        sum = sum.saturating_add(v.saturating_mul(take.into()));
        left -= take;
        if left == 0 {
            break;
        }
    }
    sum
}

/// Can a cluster with these nodes ever run the job (capacity, not load)?
/// `Ok(n)`: the fewest nodes it would take; `Err`: why not.
/// `at_origin` makes what cannot be seen count as satisfiable.
fn fits_nodes(nodes: &[Nodes<'_>], d: &Demand, at_origin: bool) -> Result<u32, String> {
    let mut usable: Vec<(u64, u64, u32)> = Vec::new(); // (tasks, spare GPUs, count)
    let mut why: Option<String> = None;
    for n in nodes {
        match node_capacity(n, d, at_origin) {
            Ok((t, g)) => usable.push((t, g, n.count)),
            Err(e) => {
                why.get_or_insert(e);
            }
        }
    }
    let avail: u32 = usable.iter().fold(0u32, |a, u| a.saturating_add(u.2));
    let what = || what_nodes(d);
    if avail == 0 {
        // The two common cases in the words users know; else the first reason.
        let typed: Vec<&Nodes> = nodes
            .iter()
            .filter(|n| match (&d.gpu_type, &n.gpu_type) {
                (_, None) => false,
                (Some(w), Some(t)) => w.eq_ignore_ascii_case(t),
                (None, Some(_)) => true,
            })
            .collect();
        let max = typed.iter().map(|n| n.gpus).max().unwrap_or(0);
        let ty = d.gpu_type.as_deref().unwrap_or("gpu");
        return Err(match why {
            _ if d.wants_gpus() && typed.is_empty() => format!("has no {}GPUs", what()),
            _ if d.wants_gpus() && max < d.gpus_per_node => {
                format!("has at most {max} {ty} per node, job needs {} per node", d.gpus_per_node)
            }
            Some(w) if !nodes.is_empty() => format!("no node can hold the job's share ({w})"),
            _ => "has no usable nodes".into(),
        });
    }
    if avail < d.min_nodes {
        return Err(format!(
            "has {avail} {}node(s) that could hold the job's share, job needs {}",
            what(),
            d.min_nodes
        ));
    }
    let mut hi = d.max_nodes.unwrap_or(u32::MAX).min(avail);
    if let Some(t) = d.tasks {
        // Never more nodes than tasks (unless -N asks for more).
        hi = hi.min(t.max(d.min_nodes));
    }
    let mut by_tasks: Vec<(u64, u32)> = usable.iter().map(|u| (u.0, u.2)).collect();
    let mut by_gpus: Vec<(u64, u32)> = usable.iter().map(|u| (u.1, u.2)).collect();
    by_tasks.sort_by_key(|g| std::cmp::Reverse(g.0));
    by_gpus.sort_by_key(|g| std::cmp::Reverse(g.0));
    let tasks_of = |n: u32| top_sum(&by_tasks, n);
    let gpus_of = |n: u32| top_sum(&by_gpus, n);
    let need_tasks = |n: u32| u64::from(d.tasks.unwrap_or(n));
    // Monotone in n: every usable node holds at least one task (its share),
    // and more nodes never hold fewer tasks or GPUs. So the fewest nodes
    // that do is found by bisection (large clusters, per submission).
    let ok = |n: u32| tasks_of(n) >= need_tasks(n) && gpus_of(n) >= u64::from(d.gpus_per_job);
    if hi >= d.min_nodes && ok(hi) {
        let (mut lo, mut up) = (d.min_nodes, hi);
        while lo < up {
            let mid = lo + (up - lo) / 2;
            if ok(mid) {
                up = mid;
            } else {
                lo = mid + 1;
            }
        }
        return Ok(lo);
    }
    // Why not, at the most nodes allowed.
    let n = hi.max(d.min_nodes).min(avail);
    let range = node_range(d);
    if gpus_of(n) < u64::from(d.gpus_per_job) {
        let per = usable.iter().map(|u| u.1).max().unwrap_or(0);
        return Err(format!(
            "holds at most {} {}GPUs on {n} node(s) ({per} per node), job needs {} on {range}",
            gpus_of(n),
            what(),
            d.gpus_per_job
        ));
    }
    Err(format!("holds at most {} task(s) on {n} node(s), job needs {} on {range}", tasks_of(n), need_tasks(n)))
}

fn what_nodes(d: &Demand) -> String {
    d.gpu_type.as_deref().map(|t| format!("{t} ")).unwrap_or_default()
}

fn node_range(d: &Demand) -> String {
    match d.max_nodes {
        Some(m) if m == d.min_nodes => format!("{m} node(s)"),
        Some(m) => format!("{}-{m} nodes", d.min_nodes),
        None if d.min_nodes > 1 => format!("{}+ nodes", d.min_nodes),
        None => "any number of nodes".into(),
    }
}

/// Can `c` ever hold `job` (capacity, not current load)? `Err` says why
/// not. Health, price and `--fleet-to` are [`place`]'s business.
pub fn fits(c: &ClusterSummary, job: &JobRequest) -> Result<u32, String> {
    fits_nodes(&nodes_of(c), &Demand::of(job), c.name == job.origin)
}

fn free_matching(c: &ClusterSummary, job: &JobRequest) -> u32 {
    let want = job.gpu_type();
    let home = c.name == job.origin;
    let free = c.gpus.iter().filter(|p| type_matches(want, &p.gpu_type, home)).map(|p| p.free);
    let free = if want.is_some() { free.max().unwrap_or(0) } else { free.sum() };
    match quota_of(c, job) {
        Some(q) => free.min(u32::try_from(q.headroom()).unwrap_or(u32::MAX)),
        None => free,
    }
}

/// The lowest known price of the GPUs `job` could use at `c` (away from home).
fn cheapest_price(c: &ClusterSummary, job: &JobRequest) -> Option<f64> {
    let want = job.gpu_type();
    c.gpus
        .iter()
        .filter(|p| type_matches(want, &p.gpu_type, false))
        .filter_map(|p| p.price_per_gpu_hour)
        .fold(None, |m: Option<f64>, p| Some(m.map_or(p, |m| m.min(p))))
}

/// The job's time limit against the longest a non-origin cluster allows
/// (`ClusterSummary::max_time_min`): Slurm there would keep a longer one
/// pending for good (`PartitionTimeLimit`). `--time=UNLIMITED` gets the
/// longest the cluster allows, so it fits anywhere.
fn time_ok(c: &ClusterSummary, job: &JobRequest) -> Result<(), String> {
    match (job.time_limit_min, c.max_time_min) {
        (Some(limit), Some(max)) if limit > max => Err(format!(
            "the job's time limit {} is above the longest allowed there (MaxTime {})",
            crate::sbatch::duration_text(u64::from(limit) * 60),
            crate::sbatch::duration_text(u64::from(max) * 60)
        )),
        _ => Ok(()),
    }
}

/// `--fleet-max-price` against a non-origin cluster: `Err` why not.
fn price_ok(c: &ClusterSummary, job: &JobRequest) -> Result<(), String> {
    let Some(max) = job.fleet.max_price else {
        return Ok(());
    };
    match cheapest_price(c, job) {
        None => Err(format!("no price known, --fleet-max-price={max} needs one")),
        Some(p) if p > max => Err(format!("{p:.2} USD/GPU-h is above --fleet-max-price={max}")),
        Some(_) => Ok(()),
    }
}

/// Does `c` have a local identity for the job's submitter? Unknown (an
/// older agent, or no user name) counts as yes: the target decides.
fn identity_ok(c: &ClusterSummary, job: &JobRequest) -> Result<(), String> {
    match (&c.identities, job.user_name.as_deref()) {
        (Some(ids), Some(user)) if !ids.admits(&job.origin, user) => {
            Err(format!("user {user} from {} has no identity there ({})", job.origin, ids.mapping))
        }
        _ => Ok(()),
    }
}

/// The GPU quota at `c` that binds `job`'s submitter, if any
/// (`ClusterSummary::gpu_quotas`: the first that names them).
pub fn quota_of<'a>(c: &'a ClusterSummary, job: &JobRequest) -> Option<&'a GpuQuota> {
    let user = job.user_name.as_deref()?;
    c.gpu_quotas.as_ref()?.iter().find(|q| q.binds(&job.origin, user))
}

/// `view` as `job` sees it: at a cluster whose GPU quota binds its
/// submitter, no pool has more GPUs free than the quota's headroom (a
/// Kubernetes namespace at its ResourceQuota creates no pod, whatever its
/// nodes have free). The job may still wait there (installed capacity is
/// untouched), as a Slurm job waits at a full association limit. For the
/// engine, which reads pools; the first rule applies quotas itself.
pub fn within_quotas(mut view: FleetView, job: &JobRequest) -> FleetView {
    for c in &mut view.clusters {
        let Some(room) = quota_of(c, job).map(GpuQuota::headroom) else { continue };
        let room = u32::try_from(room).unwrap_or(u32::MAX);
        for p in &mut c.gpus {
            p.free = p.free.min(room);
        }
    }
    view
}

/// Apply the rule. `job.origin` names the home cluster.
pub fn place(view: &FleetView, job: &JobRequest) -> (Placement, Vec<Exclusion>) {
    // GPU quotas act through `free_matching` (the rule reads free GPUs
    // nowhere else): no copy of the view per job.
    let mut excluded = Vec::new();
    let mut feasible: Vec<&ClusterSummary> = Vec::new();
    let allowed = |name: &str| job.fleet.to.is_empty() || job.fleet.to.iter().any(|t| t.eq_ignore_ascii_case(name));
    let origin_only = (!job.not_carried.is_empty()).then(|| job.not_carried.join(", "));
    for c in &view.clusters {
        let home = c.name == job.origin;
        let reason = if !allowed(&c.name) {
            Some("not in --fleet-to".to_string())
        } else if job.fleet.mode == FleetMode::Remote && home {
            Some("--fleet=remote excludes the origin".to_string())
        } else if !home && !c.healthy {
            Some(format!("no heartbeat for {:.0}s", c.heartbeat_age_s))
        } else if let (false, Some(o)) = (home, &origin_only) {
            Some(format!("{o} cannot be honoured at another cluster"))
        } else if let (false, Err(e)) = (home, price_ok(c, job)) {
            Some(e)
        } else if let (false, Err(e)) = (home, identity_ok(c, job)) {
            Some(e)
        } else if let (false, Err(e)) = (home, time_ok(c, job)) {
            Some(e)
        } else {
            // The origin's own heartbeat never keeps a job it can run from
            // home; when it cannot run it anyway, a silent origin says so.
            fits(c, job).err().map(|e| {
                if home && !c.healthy {
                    format!("no heartbeat for {:.0}s", c.heartbeat_age_s)
                } else {
                    e
                }
            })
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
        // The origin absent from its own view: nothing says it cannot run
        // the job, so it stays home (Slurm judges it).
        let home_listed = view.clusters.iter().any(|c| c.name == job.origin);
        if !home_listed && job.fleet.mode != FleetMode::Remote && allowed(&job.origin) {
            return (Placement::Home { reason: "the origin is not in the fleet view; Slurm decides".into() }, excluded);
        }
        let why = excluded.iter().map(|e| format!("{}: {}", e.cluster, e.reason)).collect::<Vec<_>>().join("; ");
        let what = describe(job);
        return (Placement::Impossible { reason: format!("no cluster in the fleet can run {what} ({why})") }, excluded);
    }
    if let Some(home) = feasible.iter().find(|c| c.name == job.origin) {
        let need = job.total_gpus();
        let home_free = free_matching(home, job);
        let others_free = feasible.iter().filter(|c| c.name != job.origin).map(|c| free_matching(c, job)).max();
        // Stay home when home can start it now, or nobody else can either.
        if home_free >= need || others_free.is_none_or(|o| o < need) {
            return (Placement::Home { reason: "the origin can run it".into() }, excluded);
        }
    }
    // Of the clusters that can start it now, the cheapest where the view
    // has prices (the meta-scheduler's model: a costlier cluster beside a
    // cheaper one with room gets the job only when the cheaper one is
    // full), then the most free matching GPUs; ties broken by name.
    let need = job.total_gpus();
    let price = |c: &ClusterSummary| cheapest_price(c, job).unwrap_or(f64::INFINITY);
    let best = feasible
        .iter()
        .filter(|c| c.name != job.origin)
        .max_by(|a, b| {
            let (fa, fb) = (free_matching(a, job), free_matching(b, job));
            (fa >= need)
                .cmp(&(fb >= need))
                .then_with(|| price(b).total_cmp(&price(a)))
                .then_with(|| fa.cmp(&fb))
                .then_with(|| b.name.cmp(&a.name))
        })
        .expect("feasible holds a non-origin cluster when the origin was not chosen");
    let reason = format!("{} free matching GPUs at {}", free_matching(best, job), best.name);
    (Placement::Remote { target: best.name.clone(), reason }, excluded)
}

/// [`place`]'s first answer, alone: true when `job` (no `--fleet*`
/// options) would be placed home because its origin can run it and has
/// the GPUs free now. The origin's own verdict depends on nothing else
/// (no other cluster, health, price or identity is read), so this is the
/// same answer for a fraction of the work: the submit hook asks it first
/// and calls [`place`] only when it says no.
pub fn home_starts_now(view: &FleetView, job: &JobRequest) -> bool {
    if job.fleet != FleetOptions::default() {
        return false;
    }
    view.clusters
        .iter()
        .find(|c| c.name == job.origin)
        .is_some_and(|home| fits(home, job).is_ok() && free_matching(home, job) >= job.total_gpus())
}

/// Can the origin run `job` natively, as far as `view` shows? True when
/// the origin is missing from the view (Slurm judges it). The agent uses
/// it when a job placed elsewhere cannot be forwarded after all (a script
/// over `MaxScriptBytes`, fields that are not UTF-8): such a job stays
/// home rather than being refused, when home can run it.
///
/// Its installed nodes count (drained, down, or not answered for while its
/// scheduler is silent): Slurm accepts a job for nodes that are down and
/// queues it, so a job is never taken for one its origin cannot run
/// because the nodes it needs are unavailable for a moment.
pub fn origin_fits(view: &FleetView, job: &JobRequest) -> bool {
    origin_verdict(view, job).is_none_or(|v| v.is_ok())
}

/// `Some(Err(why))` when the origin cannot run `job` natively with all
/// its installed nodes ([`origin_fits`]); `None` when the origin is not in
/// the view (Slurm judges alone).
pub fn origin_verdict(view: &FleetView, job: &JobRequest) -> Option<Result<(), String>> {
    let c = view.clusters.iter().find(|c| c.name == job.origin)?;
    Some(match fits(c, job) {
        Ok(_) => Ok(()),
        Err(_) if !c.installed.is_empty() && fits(&with_installed(c), job).is_ok() => Ok(()),
        Err(why) => Err(why),
    })
}

/// `c` seen with every installed node, all free (see [`all_healthy`]).
fn with_installed(c: &ClusterSummary) -> ClusterSummary {
    let mut c = c.clone();
    if !c.installed.is_empty() {
        c.nodes = c.installed.clone();
        c.gpus = installed_pools(&c.installed, &c.gpus);
    }
    c
}

/// `view` with every cluster taken as healthy: what the fleet could run
/// once the silent clusters are back.
///
/// Installed capacity counts too: a cluster whose nodes are drained or
/// down (`ClusterSummary::installed`) is seen with all its nodes, free,
/// so that capacity which exists but is unavailable now makes a job wait,
/// never refuses or fails it.
pub fn all_healthy(view: &FleetView) -> FleetView {
    let clusters = view.clusters.iter().map(|c| ClusterSummary { healthy: true, ..with_installed(c) }).collect();
    FleetView { generated_at: view.generated_at, clusters }
}

/// GPU pools of every installed node, all free (prices kept from `usable`).
fn installed_pools(installed: &[NodeShape], usable: &[GpuPool]) -> Vec<GpuPool> {
    let mut pools: Vec<GpuPool> = Vec::new();
    for n in installed {
        let Some(ty) = n.gpu_type.as_deref().filter(|_| n.gpus > 0) else { continue };
        let total = n.gpus.saturating_mul(n.count);
        match pools.iter_mut().find(|p| p.gpu_type == ty) {
            Some(p) => {
                p.total = p.total.saturating_add(total);
                p.free = p.total;
                p.max_per_node = p.max_per_node.max(n.gpus);
                p.nodes = p.nodes.saturating_add(n.count);
            }
            None => pools.push(GpuPool {
                gpu_type: ty.to_string(),
                total,
                free: total,
                max_per_node: n.gpus,
                nodes: n.count,
                price_per_gpu_hour: usable.iter().find(|p| p.gpu_type == ty).and_then(|p| p.price_per_gpu_hour),
            }),
        }
    }
    pools
}

/// The agent's form of [`place`]: a job that only silent clusters (down,
/// restarting, not yet heard from) could run is not impossible but waits,
/// as Slurm users expect of a queue: `Remote` to the cluster that would
/// take it, with a reason saying so. The meta-scheduler queues it until a
/// cluster can take it. Truly impossible requests stay `Impossible`.
pub fn place_or_wait(view: &FleetView, job: &JobRequest) -> (Placement, Vec<Exclusion>) {
    let (p, excluded) = place(view, job);
    let Placement::Impossible { reason } = &p else {
        return (p, excluded);
    };
    match place(&all_healthy(view), job) {
        (Placement::Remote { target, .. }, _) => {
            let reason = format!(
                "waiting for {target}, which has no recent heartbeat or whose nodes are drained or down ({reason})"
            );
            (Placement::Remote { target, reason }, excluded)
        }
        // Only the origin itself could run it: stay home, Slurm queues it.
        (Placement::Home { .. }, _) => (Placement::Home { reason: reason.clone() }, excluded),
        // Impossible even then: the capacity reasons say why.
        impossible => impossible,
    }
}

/// `gpu:h100:8 on 1 node(s)` style summary of the request.
pub fn describe(job: &JobRequest) -> String {
    let t = job.gpu_type().map(|t| format!("{t}:")).unwrap_or_default();
    let d = Demand::of(job);
    let only_per_node = job.gpus.iter().all(|g| matches!(g.scope, GpuScope::Node | GpuScope::Socket));
    let nodes = match (job.min_nodes, d.max_nodes) {
        (None, None) if only_per_node && d.tasks.is_none() => "1 node(s)".to_string(),
        (Some(a), None) => format!("{a} node(s)"),
        _ => node_range(&d),
    };
    let tasks = match (d.tasks, d.gpus_per_task) {
        (Some(n), g) if g > 0 => format!(" ({n} task(s) × {g} GPU)"),
        _ => String::new(),
    };
    format!("gpu:{t}{} on {nodes}{tasks}", job.total_gpus())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Exclusive, GpuRequest};

    fn pool_cluster(name: &str, ty: &str, per_node: u32, nodes: u32, free: u32) -> ClusterSummary {
        ClusterSummary {
            name: name.into(),
            healthy: true,
            gpus: vec![GpuPool {
                gpu_type: ty.into(),
                total: per_node * nodes,
                free,
                max_per_node: per_node,
                nodes,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A cluster with node shapes as the lab's: `nodes` × (8 GPUs, 32 CPUs, 64000 MiB).
    fn shaped(name: &str, ty: &str, nodes: u32, features: &[&str]) -> ClusterSummary {
        let mut c = pool_cluster(name, ty, 8, nodes, 8 * nodes);
        c.nodes = vec![NodeShape {
            gpu_type: Some(ty.into()),
            gpus: 8,
            cpus: 32,
            memory_mb: 64000,
            features: Some(features.iter().map(|f| f.to_string()).collect()),
            count: nodes,
        }];
        c
    }

    fn lab() -> FleetView {
        FleetView { generated_at: 0.0, clusters: vec![shaped("alpha", "h100", 2, &[]), shaped("beta", "a100", 2, &[])] }
    }

    /// The lab as an older meta-scheduler describes it: GPU pools only.
    fn lab_pools() -> FleetView {
        FleetView {
            generated_at: 0.0,
            clusters: vec![pool_cluster("alpha", "h100", 8, 2, 16), pool_cluster("beta", "a100", 8, 2, 16)],
        }
    }

    /// The lab plus gamma: 4 H100 nodes with InfiniBand.
    fn fleet3() -> FleetView {
        let mut v = lab();
        v.clusters.push(shaped("gamma", "h100", 4, &["ib", "nvlink"]));
        v
    }

    /// A target is refused when its largest node lacks the job's per-node
    /// memory (`--mem`, `--mem-per-cpu` × its CPUs per node, `--mem-per-gpu`
    /// × its GPUs per node): Slurm checks RealMemory when it selects nodes,
    /// also under `CR_Core`, where agents now report it too.
    #[test]
    fn a_target_whose_largest_node_lacks_the_jobs_memory_is_refused() {
        // small: 4 nodes of 64000 MiB, the most free GPUs (picked when both
        // can run the job); big: 1 node of 256000 MiB.
        let mut big = shaped("big", "h100", 1, &[]);
        big.nodes[0].memory_mb = 256_000;
        let v = FleetView {
            generated_at: 0.0,
            clusters: vec![shaped("beta", "a100", 2, &[]), shaped("small", "h100", 4, &[]), big.clone()],
        };
        let no_big = FleetView { generated_at: 0.0, clusters: v.clusters[..2].to_vec() };
        for (args, want, alone) in [
            ("--gres=gpu:h100:8 --mem=64000", "small", "small"),
            ("--gres=gpu:h100:8 --mem=64001", "big", "impossible: no cluster in the fleet can run gpu:h100:8 on 1 node(s) (beta: has no h100 GPUs; small: no node can hold the job's share (64000 MiB per node, job needs --mem=64001M"),
            ("--gres=gpu:h100:8 --mem=256001", "impossible", "impossible"),
            ("--gres=gpu:h100:1 -c=8 --mem-per-cpu=8000", "small", "small"),
            ("--gres=gpu:h100:1 -c=8 --mem-per-cpu=10000", "big", "impossible: no cluster in the fleet can run gpu:h100:1 on 1 node(s) (beta: has no h100 GPUs; small: no node can hold the job's share (64000 MiB per node, job needs --mem-per-cpu=10000M × 8 CPU(s) = 80000 MiB per node"),
            ("--gres=gpu:h100:1 --ntasks-per-node=4 -c=2 --mem-per-cpu=10000", "big", "impossible"),
            ("--gres=gpu:h100:4 --cpus-per-gpu=2 --mem-per-cpu=9000", "big", "impossible"),
            ("--gpus-per-node=h100:4 --mem-per-gpu=16000", "small", "small"),
            ("--gpus-per-node=h100:4 --mem-per-gpu=20000", "big", "impossible: no cluster in the fleet can run gpu:h100:4 on 1 node(s) (beta: has no h100 GPUs; small: no node can hold the job's share (64000 MiB per node, job needs 80000 MiB for 4 GPUs"),
            ("--gpus=h100:8 --mem-per-gpu=70000", "impossible", "impossible"),
            ("--gpus=h100:2 --mem-per-gpu=70000", "big", "impossible: no cluster in the fleet can run gpu:h100:2 on any number of nodes (beta: has no h100 GPUs; small: no node can hold the job's share (64000 MiB per node, job needs --mem-per-gpu=70000M for each GPU"),
        ] {
            check(&v, "beta", args, want, None);
            check(&no_big, "beta", args, alone, None);
        }
        // Unknown memory (an older agent) is no bound.
        let mut unknown = no_big.clone();
        unknown.clusters[1].nodes[0].memory_mb = 0;
        check(&unknown, "beta", "--gres=gpu:h100:8 --mem=999999", "small", Some(1));
    }

    #[test]
    fn a_full_gpu_quota_of_the_submitter_sends_the_job_where_it_can_start() {
        use crate::api::GpuQuota;
        let mut v = fleet3();
        let job = |user: &str| JobRequest { user_name: Some(user.into()), ..req("beta", "--gres=gpu:h100:8") };
        let target = |v: &FleetView, j: &JobRequest| match place(v, j).0 {
            Placement::Remote { target, .. } => target,
            p => panic!("{p:?}"),
        };
        let first = target(&v, &job("alice"));
        let other = if first == "alpha" { "gamma" } else { "alpha" };
        let i = v.clusters.iter().position(|c| c.name == first).unwrap();
        let quota = |hard, used| {
            Some(vec![GpuQuota { scope: "namespace ml".into(), users: vec!["beta:alice".into()], hard, used }])
        };
        // alice's namespace there has 4 GPUs left of 12: her 8-GPU job goes
        // where it can start; bob, whom the quota does not bind, still there.
        v.clusters[i].gpu_quotas = quota(12, 8);
        assert_eq!(target(&v, &job("alice")), other);
        assert_eq!(target(&v, &job("bob")), first);
        assert_eq!(within_quotas(v.clone(), &job("bob")), v, "unchanged where no quota binds");
        let seen = within_quotas(v.clone(), &job("alice"));
        assert!(seen.clusters[i].gpus.iter().all(|p| p.free <= 4), "{:?}", seen.clusters[i].gpus);
        assert_eq!(seen.clusters[i].nodes, v.clusters[i].nodes, "the nodes stay: it may wait there");
        // alice from another origin is not bound by it.
        assert_eq!(target(&v, &JobRequest { origin: "delta".into(), ..job("alice") }), first);
        // Room again (more than the nodes have free): back to the first choice.
        v.clusters[i].gpu_quotas = quota(100, 8);
        assert_eq!(target(&v, &job("alice")), first);
        // Pinned there with the quota full: placed there all the same, to
        // wait for its quota as a Slurm job waits at an association limit.
        v.clusters[i].gpu_quotas = quota(12, 12);
        let pinned =
            JobRequest { fleet: FleetOptions { to: vec![first.clone()], ..Default::default() }, ..job("alice") };
        assert_eq!(target(&v, &pinned), first);
    }

    #[test]
    fn a_user_a_cluster_cannot_map_is_not_sent_there() {
        use crate::api::Identities;
        let mut v = fleet3();
        let ids = |users: &[&str]| {
            Some(Identities {
                mapping: "JobUserMap=/etc/slurm/fleet-users.map".into(),
                users: users.iter().map(|u| u.to_string()).collect(),
            })
        };
        v.clusters[0].identities = ids(&["beta:alice", "*:bob"]); // alpha
        v.clusters[2].identities = ids(&["*:bob"]); // gamma
        let job = |user: &str| JobRequest { user_name: Some(user.into()), ..req("beta", "--gres=gpu:h100:8") };
        // alice is mapped at alpha only, bob everywhere.
        assert!(matches!(place(&v, &job("alice")).0, Placement::Remote { target, .. } if target == "alpha"));
        assert!(matches!(place(&v, &job("bob")).0, Placement::Remote { .. }));
        // mallory nowhere: refused, the reason naming each cluster's mapping.
        let (p, ex) = place_or_wait(&v, &job("mallory"));
        let Placement::Impossible { reason } = p else { panic!("{p:?}") };
        assert!(
            reason.contains(
                "alpha: user mallory from beta has no identity there (JobUserMap=/etc/slurm/fleet-users.map)"
            ),
            "{reason}"
        );
        assert_eq!(ex.iter().filter(|e| e.reason.contains("no identity")).count(), 2, "{ex:?}");
        // alice from another origin is not alice from beta.
        let other = JobRequest { origin: "delta".into(), ..job("alice") };
        assert!(!v.clusters[0].identities.as_ref().unwrap().admits(&other.origin, "alice"));
        // A shared RunAsUser admits anyone; an agent that publishes nothing
        // is not judged (the target decides).
        v.clusters[0].identities = ids(&["*:*"]);
        v.clusters[2].identities = None;
        assert!(matches!(place(&v, &job("mallory")).0, Placement::Remote { .. }));
        // A job the origin can run stays home whoever submits it.
        assert!(matches!(
            place(&v, &JobRequest { user_name: Some("mallory".into()), ..req("beta", "--gres=gpu:a100:8") }).0,
            Placement::Home { .. }
        ));
    }

    /// A request from sbatch-style arguments (the forms the plugin reads
    /// from job_desc, already normalised as sbatch sends them).
    fn req(origin: &str, args: &str) -> JobRequest {
        let mut j = JobRequest { origin: origin.into(), ..Default::default() };
        let gpu = |v: &str, scope: GpuScope| {
            let (t, n) = match v.rsplit_once(':') {
                Some((t, n)) => (Some(t.to_string()), n.parse().unwrap()),
                None => (None, v.parse().unwrap()),
            };
            GpuRequest { gpu_type: t, count: n, scope }
        };
        for a in args.split_whitespace() {
            let (k, v) = a.split_once('=').unwrap_or((a, ""));
            let num = || v.parse::<u32>().unwrap();
            match k {
                "--gpus" => j.gpus.push(gpu(v, GpuScope::Job)),
                "--gres" => j.gpus.push(gpu(v.trim_start_matches("gpu:"), GpuScope::Node)),
                "--gpus-per-node" => j.gpus.push(gpu(v, GpuScope::Node)),
                "--gpus-per-task" => j.gpus.push(gpu(v, GpuScope::Task)),
                "--gpus-per-socket" => j.gpus.push(gpu(v, GpuScope::Socket)),
                "-N" => {
                    let (a, b) = v.split_once('-').unwrap_or((v, v));
                    j.min_nodes = Some(a.parse().unwrap());
                    j.max_nodes = Some(b.parse().unwrap());
                }
                "-n" => j.num_tasks = Some(num()),
                "--ntasks-per-node" => j.ntasks_per_node = Some(num()),
                "-c" => j.cpus_per_task = Some(num()),
                "--cpus-per-gpu" => j.cpus_per_gpu = Some(num()),
                "--mem" => j.mem_per_node_mb = Some(v.parse().unwrap()),
                "--mem-per-cpu" => j.mem_per_cpu_mb = Some(v.parse().unwrap()),
                "--mem-per-gpu" => j.mem_per_gpu_mb = Some(v.parse().unwrap()),
                "--exclusive" => j.exclusive = Some(Exclusive::Node),
                "-C" => j.constraint = Some(v.into()),
                "-L" => j.not_carried.push(format!("--licenses={v}")),
                "--fleet" => j.fleet.mode = if v == "remote" { FleetMode::Remote } else { FleetMode::Local },
                "--fleet-to" => j.fleet.to = v.split(',').map(Into::into).collect(),
                "--fleet-max-price" => j.fleet.max_price = Some(v.parse().unwrap()),
                _ => panic!("test helper: unknown {k}"),
            }
        }
        j
    }

    fn outcome(view: &FleetView, j: &JobRequest) -> String {
        match place(view, j).0 {
            Placement::Home { .. } => "home".to_string(),
            Placement::Remote { target, .. } => target,
            Placement::Impossible { reason } => format!("impossible: {reason}"),
        }
    }

    /// `expected`: `home`, a cluster name, or `impossible: <start of the reason>`;
    /// `nodes`: how many nodes the chosen cluster would give the job.
    fn check(view: &FleetView, origin: &str, args: &str, expected: &str, nodes: Option<u32>) {
        let j = req(origin, args);
        let got = outcome(view, &j);
        assert!(got.starts_with(expected), "{origin}: {args}\n got {got:?}\n expected {expected:?}");
        if let Some(n) = nodes {
            let at = if expected == "home" { origin } else { expected };
            let c = view.clusters.iter().find(|c| c.name == at).unwrap();
            assert_eq!(fits(c, &j), Ok(n), "{origin}: {args}: node count at {at}");
        }
    }

    /// The lab plus a Kubernetes cluster: 2 H100 nodes and one A100 cut
    /// into 7 MIG 1g.10gb slices (what kube-gamma's agent reports).
    fn with_mig() -> FleetView {
        let mut v = lab();
        let mut k = shaped("kube", "h100", 2, &[]);
        k.gpus.push(GpuPool {
            gpu_type: "1g.10gb".into(),
            total: 7,
            free: 7,
            max_per_node: 7,
            nodes: 1,
            ..Default::default()
        });
        k.nodes.push(NodeShape {
            gpu_type: Some("1g.10gb".into()),
            gpus: 7,
            cpus: 32,
            memory_mb: 64000,
            features: Some(vec![]),
            count: 1,
        });
        v.clusters.push(k);
        v
    }

    #[test]
    fn of_the_clusters_that_can_start_it_now_the_cheapest_wins() {
        let mut v = with_mig();
        v.clusters[0].gpus[0].price_per_gpu_hour = Some(1.49); // alpha
        v.clusters[2].gpus[0].price_per_gpu_hour = Some(2.49); // kube
                                                               // alpha busier than kube but able to start it: alpha, the cheaper.
        v.clusters[0].gpus[0].free = 8;
        check(&v, "beta", "--gres=gpu:h100:8", "alpha", Some(1));
        // alpha cannot start it now: kube, which can.
        v.clusters[0].gpus[0].free = 4;
        check(&v, "beta", "--gres=gpu:h100:8", "kube", Some(1));
        // Without prices, the most free GPUs, as before.
        v.clusters[0].gpus[0].free = 8;
        v.clusters[0].gpus[0].price_per_gpu_hour = None;
        v.clusters[2].gpus[0].price_per_gpu_hour = None;
        check(&v, "beta", "--gres=gpu:h100:8", "kube", Some(1));
    }

    #[test]
    fn mig_slices_serve_only_requests_that_name_them() {
        let v = &with_mig();
        check(v, "beta", "--gres=gpu:1g.10gb:1", "kube", Some(1));
        check(v, "beta", "--gres=gpu:1g.10gb:7", "kube", Some(1));
        check(v, "alpha", "--gres=gpu:1g.10gb:8", "impossible: ", None);
        // Any GPU: never a slice elsewhere, so three nodes are nowhere.
        check(v, "alpha", "-N=3 --gres=gpu:1", "impossible: ", None);
        check(v, "beta", "--gpus=16 --cpus-per-gpu=5", "impossible: ", None);
        let (p, _) = place(v, &req("beta", "-N=3 --gres=gpu:1"));
        let Placement::Impossible { reason } = p else { panic!("{p:?}") };
        assert!(reason.contains("kube: has 2 node(s) that could hold the job's share, job needs 3"), "{reason}");
        let mut slices_only = v.clusters[2].clone();
        slices_only.nodes.remove(0);
        let why = fits(&slices_only, &req("beta", "--gres=gpu:1")).unwrap_err();
        assert!(why.contains("1g.10gb MIG slices, only for requests naming 1g.10gb"), "{why}");
        // Free counts and prices of an untyped request leave slices out.
        let j = req("beta", "--gres=gpu:1");
        assert_eq!(free_matching(&v.clusters[2], &j), 16);
        // At the origin Slurm's own matching stands: any type serves "a GPU".
        let mut home = with_mig();
        home.clusters[2].name = "beta".into();
        home.clusters.remove(1);
        assert_eq!(fits(&home.clusters[1], &req("beta", "-N=3 --gres=gpu:1")), Ok(3));
        for (t, m) in
            [("1g.10gb", true), ("a100_3g.40gb", true), ("mig-2g.20gb", true), ("h100", false), ("g.gb", false)]
        {
            assert_eq!(is_mig_profile(t), m, "{t}");
        }
    }

    #[test]
    fn requests_against_cluster_shapes() {
        let (v, p, f) = (&lab(), &lab_pools(), &fleet3());
        // Finding 1: valid multi-node jobs at the H100 cluster stay home.
        check(v, "alpha", "--gpus=h100:16", "home", Some(2));
        check(v, "alpha", "--gpus=h100:12", "home", Some(2));
        check(v, "alpha", "--gpus=9", "home", Some(2));
        check(v, "alpha", "--gpus-per-task=h100:2 -n=8", "home", Some(2));
        check(v, "alpha", "-n=16 --gpus-per-task=1", "home", Some(2));
        check(v, "alpha", "--gpus=h100:16 -N=1-2", "home", Some(2));
        check(v, "beta", "--gpus=a100:9", "home", Some(2));
        // The same from pools only (an older meta-scheduler).
        check(p, "alpha", "--gpus=h100:16", "home", Some(2));
        check(p, "alpha", "--gpus=9", "home", Some(2));
        check(p, "alpha", "-n=16 --gpus-per-task=1", "home", Some(2));
        check(p, "beta", "--gpus=a100:9", "home", Some(2));
        check(p, "beta", "--gpus=h100:16", "alpha", Some(2));
        // Single node forms.
        check(v, "alpha", "--gres=gpu:h100:8", "home", Some(1));
        check(v, "alpha", "--gpus-per-node=h100:4 -N=2", "home", Some(2));
        check(v, "alpha", "--gpus-per-socket=h100:2", "home", Some(1));
        check(v, "alpha", "--gres=gpu:8 -N=2 --ntasks-per-node=8", "home", Some(2));
        // Too many per node, whatever the node count.
        check(
            v,
            "alpha",
            "--gres=gpu:h100:9",
            "impossible: no cluster in the fleet can run gpu:h100:9 on 1 node(s)",
            None,
        );
        check(v, "alpha", "--gpus=h100:16 -N=1", "impossible: no cluster in the fleet can run gpu:h100:16 on 1 node(s) (alpha: holds at most 8 h100 GPUs on 1 node(s)", None);
        check(v, "alpha", "--gpus=h100:17", "impossible", None);
        check(
            v,
            "alpha",
            "--gpus=h100:16 -N=3",
            "impossible: no cluster in the fleet can run gpu:h100:16 on 3 node(s) (alpha: has 2 h100 node(s)",
            None,
        );
        check(v, "alpha", "--gpus-per-task=h100:2 -n=9", "impossible", None);
        check(v, "alpha", "--gpus-per-task=h100:3 -n=6", "impossible", None);
        check(v, "alpha", "--gpus-per-task=h100:3 -n=4", "home", Some(2));
        // Jobs that must leave beta for alpha.
        check(v, "beta", "--gres=gpu:h100:8", "alpha", Some(1));
        check(v, "beta", "--gpus=h100:16", "alpha", Some(2));
        check(v, "beta", "--gpus-per-task=h100:2 -n=8", "alpha", Some(2));
        check(v, "beta", "--gpus=h100:16 -N=1-2", "alpha", Some(2));
        check(v, "beta", "--gpus=h100:16 -N=1", "impossible", None);
        // CPUs and tasks.
        check(v, "alpha", "--gres=gpu:1 -n=64", "home", Some(2));
        check(v, "alpha", "--gres=gpu:1 -n=65", "impossible", None);
        check(v, "alpha", "--gres=gpu:1 -n=8 -c=8", "home", Some(2));
        check(v, "alpha", "--gres=gpu:1 -c=33", "impossible", None);
        check(v, "alpha", "--gres=gpu:1 --ntasks-per-node=33", "impossible", None);
        check(v, "alpha", "--gpus=h100:16 --cpus-per-gpu=4", "home", Some(2));
        check(v, "alpha", "--gpus=h100:16 --cpus-per-gpu=5", "impossible", None);
        check(v, "alpha", "--gpus=h100:8 --cpus-per-gpu=5", "home", Some(2));
        // Memory forms.
        check(v, "alpha", "--gres=gpu:8 --mem=64000", "home", Some(1));
        check(v, "alpha", "--gres=gpu:8 --mem=64001", "impossible", None);
        check(v, "alpha", "--gres=gpu:8 --mem=0", "home", Some(1));
        check(v, "alpha", "--gres=gpu:1 -n=32 --mem-per-cpu=2000", "home", Some(1));
        check(v, "alpha", "--gres=gpu:1 -n=32 --mem-per-cpu=4000", "home", Some(2));
        check(v, "alpha", "--gres=gpu:1 -n=64 --mem-per-cpu=4000", "impossible", None);
        check(v, "alpha", "--gpus=h100:16 --mem-per-gpu=8000", "home", Some(2));
        check(v, "alpha", "--gpus=h100:16 --mem-per-gpu=8001", "impossible", None);
        check(v, "alpha", "--gres=gpu:8 --mem-per-gpu=9000", "impossible", None);
        // Pools only: memory and CPUs unknown, the origin is not second-guessed.
        check(p, "alpha", "--gres=gpu:8 --mem=999999", "home", Some(1));
        // Exclusive changes nothing about feasibility.
        check(v, "alpha", "--gpus=h100:16 --exclusive", "home", Some(2));
        // Constraints: gamma has ib; alpha's features are known and empty.
        check(f, "beta", "--gres=gpu:h100:8 -C=ib", "gamma", Some(1));
        check(f, "beta", "--gres=gpu:h100:8 -C=ib&nvlink", "gamma", Some(1));
        check(f, "beta", "--gres=gpu:h100:8 -C=ib|roce", "gamma", Some(1));
        check(f, "beta", "--gres=gpu:h100:8 -C=roce", "impossible", None);
        check(f, "alpha", "--gres=gpu:h100:8 -C=ib", "gamma", Some(1));
        check(f, "beta", "--gpus=h100:24", "gamma", Some(3));
        // Unknown features: the origin decides itself; others are not offered a constraint.
        check(p, "alpha", "--gres=gpu:8 -C=[ib*2&nvlink]", "home", Some(1));
        check(p, "beta", "--gres=gpu:h100:8 -C=ib", "impossible: no cluster in the fleet can run gpu:h100:8 on 1 node(s) (alpha: no node can hold the job's share (node features unknown", None);
        // Options only the origin can honour.
        check(v, "beta", "--gres=gpu:a100:8 -L=matlab:1", "home", Some(1));
        check(v, "beta", "--gres=gpu:h100:8 -L=matlab:1", "impossible: no cluster in the fleet can run gpu:h100:8 on 1 node(s) (alpha: --licenses=matlab:1 cannot be honoured at another cluster", None);
        // --fleet-to, --fleet=remote.
        check(v, "beta", "--gres=gpu:a100:1 --fleet-to=beta", "home", Some(1));
        check(v, "beta", "--gres=gpu:h100:1 --fleet-to=beta", "impossible", None);
        check(v, "beta", "--gres=gpu:h100:1 --fleet-to=gamma", "impossible", None);
        check(v, "beta", "--gres=gpu:a100:1 --fleet=remote", "impossible", None);
        check(v, "beta", "--gres=gpu:8 --fleet=remote", "alpha", Some(1));
        // No GPUs at all (a job with --fleet options only).
        check(v, "beta", "--fleet-to=beta", "home", Some(1));
        check(v, "beta", "-n=4", "home", Some(1));
        check(v, "beta", "-N=3", "impossible", None);
        // Untyped jobs may use either type: --gpus=20 fits gamma's 32.
        check(f, "beta", "--gpus=20", "gamma", Some(3));
    }

    #[test]
    fn max_price_excludes_clusters_above_it_or_without_a_price() {
        let mut v = lab();
        let d = FleetOptions::default;
        let h100 = |max: Option<f64>| JobRequest {
            fleet: FleetOptions { max_price: max, ..d() },
            ..req("beta", "--gres=gpu:h100:8")
        };
        let got = outcome(&v, &h100(Some(2.0)));
        assert!(got.contains("alpha: no price known, --fleet-max-price=2 needs one"), "{got}");
        v.clusters[0].gpus[0].price_per_gpu_hour = Some(3.5);
        let got = outcome(&v, &h100(Some(2.0)));
        assert!(got.contains("alpha: 3.50 USD/GPU-h is above --fleet-max-price=2"), "{got}");
        assert_eq!(outcome(&v, &h100(Some(4.0))), "alpha");
        assert_eq!(outcome(&v, &h100(None)), "alpha");
        // The origin is never excluded by price: home is not bought.
        v.clusters[1].gpus[0].price_per_gpu_hour = Some(9.0);
        let a100 =
            JobRequest { fleet: FleetOptions { max_price: Some(1.0), ..d() }, ..req("beta", "--gres=gpu:a100:8") };
        assert_eq!(outcome(&v, &a100), "home");
    }

    /// A job whose time limit is above a cluster's `MaxTime` would pend
    /// there for good (`PartitionTimeLimit`): it goes where it can run, or
    /// is refused naming the limit.
    #[test]
    fn a_cluster_whose_max_time_is_below_the_jobs_limit_is_not_offered_it() {
        let mut v = fleet3();
        v.clusters[0].max_time_min = Some(2 * 24 * 60);
        v.clusters[2].max_time_min = Some(60);
        let h100 = |limit: Option<u32>, unlimited: bool| JobRequest {
            time_limit_min: limit,
            time_unlimited: unlimited,
            ..req("beta", "--gres=gpu:h100:8")
        };
        // gamma has the most free GPUs: picked while the limit fits.
        assert_eq!(outcome(&v, &h100(Some(60), false)), "gamma");
        assert_eq!(outcome(&v, &h100(None, false)), "gamma", "no --time: the target's default");
        assert_eq!(outcome(&v, &h100(None, true)), "gamma", "UNLIMITED: the longest the target allows");
        assert_eq!(outcome(&v, &h100(Some(61), false)), "alpha");
        let got = outcome(&v, &h100(Some(3 * 24 * 60), false));
        assert!(
            got.contains(
                "alpha: the job's time limit 3-00:00:00 is above the longest allowed there (MaxTime 2-00:00:00)"
            ) && got.contains(
                "gamma: the job's time limit 3-00:00:00 is above the longest allowed there (MaxTime 01:00:00)"
            ),
            "{got}"
        );
        // The origin judges its own jobs (Slurm there).
        v.clusters[1].max_time_min = Some(1);
        assert_eq!(outcome(&v, &JobRequest { time_limit_min: Some(90), ..req("beta", "--gres=gpu:a100:8") }), "home");
    }

    #[test]
    fn busy_home_sends_work_where_gpus_are_free() {
        let mut v = lab_pools();
        v.clusters.push(pool_cluster("gamma", "a100", 8, 4, 32));
        v.clusters[1].gpus[0].free = 0;
        let (p, _) = place(&v, &req("beta", "--gres=gpu:a100:8"));
        assert_eq!(p, Placement::Remote { target: "gamma".into(), reason: "32 free matching GPUs at gamma".into() });
    }

    #[test]
    fn unhealthy_clusters_are_excluded_with_reason() {
        let mut v = lab();
        v.clusters[0].healthy = false;
        v.clusters[0].heartbeat_age_s = 42.0;
        let (p, ex) = place(&v, &req("beta", "--gres=gpu:h100:8"));
        assert!(matches!(p, Placement::Impossible { .. }));
        assert!(ex.iter().any(|e| e.cluster == "alpha" && e.reason == "no heartbeat for 42s"), "{ex:?}");
    }

    #[test]
    fn a_job_only_a_silent_cluster_could_run_waits_for_it() {
        let mut v = lab();
        v.clusters[0].healthy = false;
        v.clusters[0].heartbeat_age_s = 42.0;
        let (p, _) = place_or_wait(&v, &req("beta", "--gres=gpu:h100:8"));
        let Placement::Remote { target, reason } = p else { panic!("{p:?}") };
        assert_eq!(target, "alpha");
        assert!(reason.starts_with("waiting for alpha, which has no recent heartbeat"), "{reason}");
        // Alive but every node drained or down: the installed nodes make it wait.
        let mut v = lab();
        v.clusters[0].installed = v.clusters[0].nodes.clone();
        v.clusters[0].nodes.clear();
        v.clusters[0].gpus.clear();
        assert!(matches!(place(&v, &req("beta", "--gres=gpu:h100:8")).0, Placement::Impossible { .. }));
        let (p, _) = place_or_wait(&v, &req("beta", "--gres=gpu:h100:8"));
        assert!(matches!(&p, Placement::Remote { target, .. } if target == "alpha"), "{p:?}");
        // More than is installed stays impossible.
        assert!(matches!(place_or_wait(&v, &req("beta", "--gres=gpu:h100:8 -N=3")).0, Placement::Impossible { .. }));
        let mut v = lab();
        v.clusters[0].healthy = false;
        // Impossible even with every cluster up: still refused, with the reason.
        let (p, _) = place_or_wait(&v, &req("beta", "--gres=gpu:h100:512"));
        assert!(
            matches!(&p, Placement::Impossible { reason } if reason.contains("alpha: has at most 8 h100 per node, job needs 512 per node")),
            "{p:?}"
        );
        // Healthy answers are place()'s.
        let j = req("beta", "--gres=gpu:h100:8");
        assert_eq!(place_or_wait(&lab(), &j).0, place(&lab(), &j).0);
        // The origin silent in its own view: the job stays home.
        let mut v = lab();
        v.clusters[1].healthy = false;
        assert!(matches!(place_or_wait(&v, &req("beta", "--gres=gpu:a100:8")).0, Placement::Home { .. }));
        // The origin missing from the view: home too.
        let v = FleetView { generated_at: 0.0, clusters: vec![shaped("alpha", "h100", 2, &[])] };
        assert!(matches!(place(&v, &req("beta", "--gres=gpu:a100:8")).0, Placement::Home { .. }));
    }

    #[test]
    fn origin_fits_answers_for_home() {
        assert!(origin_fits(&lab(), &req("alpha", "--gpus=h100:16")));
        assert!(!origin_fits(&lab(), &req("beta", "--gpus=h100:16")));
        assert!(origin_fits(&lab(), &req("gamma", "--gpus=h100:16")), "not in the view: Slurm judges");
    }

    /// The origin's scheduler does not answer its agent for a moment
    /// (`scontrol reconfigure`, a slurmctld restart): its heartbeat names
    /// the nodes it saw last, none usable. Slurm still accepts the jobs
    /// they can run (and queues them): such a job stays home, is never
    /// taken for one its origin cannot run; more than is installed is.
    #[test]
    fn an_origin_whose_nodes_are_unavailable_for_a_moment_still_runs_what_they_can() {
        let mut v = lab();
        let beta = &mut v.clusters[1];
        beta.installed = std::mem::take(&mut beta.nodes);
        beta.gpus.clear();
        beta.healthy = false;
        let a100 = req("beta", "--gres=gpu:a100:1");
        assert!(!home_starts_now(&v, &a100));
        assert!(matches!(place(&v, &a100).0, Placement::Impossible { .. }), "nothing usable now");
        let (p, _) = place_or_wait(&v, &a100);
        assert!(matches!(p, Placement::Home { .. }), "{p:?}");
        for ok in ["--gres=gpu:a100:8", "--gpus=a100:16", "--gres=gpu:a100:8 -N=2"] {
            assert!(origin_fits(&v, &req("beta", ok)), "{ok}");
            assert_eq!(origin_verdict(&v, &req("beta", ok)), Some(Ok(())), "{ok}");
        }
        for no in ["--gpus=a100:24", "--gres=gpu:h100:1"] {
            assert!(!origin_fits(&v, &req("beta", no)), "{no}");
            assert!(matches!(origin_verdict(&v, &req("beta", no)), Some(Err(_))), "{no}");
            assert!(matches!(
                place_or_wait(&v, &req("beta", no)).0,
                Placement::Impossible { .. } | Placement::Remote { .. }
            ));
        }
        // Before, such a heartbeat named no node at all: the job was refused.
        v.clusters[1].installed.clear();
        assert!(matches!(place_or_wait(&v, &a100).0, Placement::Impossible { .. }));
    }

    #[test]
    fn constraints_parse() {
        assert_eq!(Constraint::parse(""), None);
        assert_eq!(Constraint::parse("ib"), Some(Constraint::All(vec!["ib".into()])));
        assert_eq!(Constraint::parse("a&b,c"), Some(Constraint::All(vec!["a".into(), "b".into(), "c".into()])));
        assert_eq!(Constraint::parse("a|b"), Some(Constraint::Any(vec!["a".into(), "b".into()])));
        assert_eq!(Constraint::parse("a|b&c"), Some(Constraint::Complex("a|b&c".into())));
        assert_eq!(Constraint::parse("[a*2&b*2]"), Some(Constraint::Complex("[a*2&b*2]".into())));
    }

    #[test]
    fn node_shapes_group_identical_nodes() {
        let ib = ["ib".to_string()];
        let shapes = node_shapes([
            (Some("h100"), 8, 32, 64000, Some(&ib[..])),
            (Some("h100"), 8, 32, 64000, Some(&ib[..])),
            (Some("h100"), 4, 32, 64000, None),
            (None, 0, 64, 128000, None),
        ]);
        assert_eq!(shapes.len(), 3);
        assert_eq!(shapes[0].count, 2);
        assert_eq!(shapes[0].features.as_deref(), Some(&ib[..]));
        assert_eq!((shapes[1].gpus, shapes[1].count), (4, 1));
    }

    #[test]
    fn describe_says_what_was_asked() {
        assert_eq!(describe(&req("a", "--gres=gpu:h100:8")), "gpu:h100:8 on 1 node(s)");
        assert_eq!(describe(&req("a", "--gpus=h100:16")), "gpu:h100:16 on any number of nodes");
        assert_eq!(describe(&req("a", "--gpus=h100:16 -N=1-2")), "gpu:h100:16 on 1-2 nodes");
        assert_eq!(describe(&req("a", "--gpus-per-task=2 -n=8")), "gpu:16 on any number of nodes (8 task(s) × 2 GPU)");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn arb_cluster(name: &'static str) -> impl Strategy<Value = ClusterSummary> {
            (
                prop::sample::select(vec!["h100", "a100"]),
                1u32..=8,
                1u32..=4,
                prop::sample::select(vec![8u32, 32, 64]),
                prop::sample::select(vec![16000u64, 64000, 256000]),
                any::<bool>(),
                any::<bool>(),
                any::<bool>(),
            )
                .prop_map(move |(ty, gpus, count, cpus, mem, shapes, ib, healthy)| {
                    let mut c = ClusterSummary {
                        name: name.into(),
                        healthy,
                        heartbeat_age_s: 1.0,
                        gpus: vec![GpuPool {
                            gpu_type: ty.into(),
                            total: gpus * count,
                            free: gpus,
                            max_per_node: gpus,
                            nodes: count,
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                    if shapes {
                        let features = Some(if ib { vec!["ib".to_string()] } else { vec![] });
                        c.nodes =
                            vec![NodeShape { gpu_type: Some(ty.into()), gpus, cpus, memory_mb: mem, features, count }];
                    }
                    c
                })
        }

        fn arb_job() -> impl Strategy<Value = JobRequest> {
            let scope = prop::sample::select(vec![GpuScope::Job, GpuScope::Node, GpuScope::Task, GpuScope::Socket]);
            let gpu = (prop::option::of(prop::sample::select(vec!["h100", "a100"])), 1u32..=24, scope)
                .prop_map(|(t, count, scope)| GpuRequest { gpu_type: t.map(Into::into), count, scope });
            (
                prop::option::of(gpu),
                prop::option::of((1u32..=5, 0u32..=3)),
                prop::option::of(1u32..=80),
                prop::option::of(1u32..=16),
                prop::option::of(1u32..=16),
                prop::option::of(prop::sample::select(vec![0u64, 1000, 8000, 70000])),
                prop::option::of(prop::sample::select(vec![500u64, 4000])),
                prop::option::of(prop::sample::select(vec!["ib", "ib|x", "[ib*1]"])),
                (
                    prop::option::of(0.5f64..5.0),
                    any::<bool>(),
                    prop::option::of(prop::sample::select(vec![1000u64, 9000])),
                ),
            )
                .prop_map(
                    |(gpu, nodes, tasks, tpn, cpt, mem, mem_cpu, constraint, (price, licensed, mem_gpu))| JobRequest {
                        origin: "home".into(),
                        gpus: gpu.into_iter().collect(),
                        min_nodes: nodes.map(|n| n.0),
                        max_nodes: nodes.map(|n| n.0 + n.1),
                        num_tasks: tasks,
                        ntasks_per_node: tpn,
                        cpus_per_task: cpt,
                        mem_per_node_mb: mem,
                        mem_per_cpu_mb: mem_cpu.filter(|_| mem.is_none()),
                        mem_per_gpu_mb: mem_gpu,
                        constraint: constraint.map(Into::into),
                        not_carried: if licensed { vec!["--licenses=x:1".into()] } else { vec![] },
                        fleet: FleetOptions { max_price: price, ..Default::default() },
                        ..Default::default()
                    },
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            /// A job the origin can run is never refused (whatever the
            /// rest of the fleet, its health, prices, licenses or the
            /// origin's own heartbeat).
            #[test]
            fn feasible_at_origin_is_never_refused(home in arb_cluster("home"), a in arb_cluster("a"), b in arb_cluster("b"), job in arb_job()) {
                let view = FleetView { generated_at: 0.0, clusters: vec![a, home.clone(), b] };
                if fits(&home, &job).is_ok() {
                    let (p, _) = place(&view, &job);
                    prop_assert!(!matches!(p, Placement::Impossible { .. }), "{p:?}");
                    let (p, _) = place_or_wait(&view, &job);
                    prop_assert!(!matches!(p, Placement::Impossible { .. }), "{p:?}");
                }
            }

            /// Remote picks are feasible there and never the origin; Home
            /// only when the origin can run it.
            #[test]
            fn picks_are_feasible(home in arb_cluster("home"), a in arb_cluster("a"), job in arb_job()) {
                let view = FleetView { generated_at: 0.0, clusters: vec![home.clone(), a.clone()] };
                match place(&view, &job).0 {
                    Placement::Remote { target, .. } => {
                        prop_assert_eq!(&target, "a");
                        prop_assert!(a.healthy && fits(&a, &job).is_ok() && job.not_carried.is_empty());
                    }
                    Placement::Home { .. } => prop_assert!(fits(&home, &job).is_ok()),
                    Placement::Impossible { .. } => prop_assert!(fits(&home, &job).is_err()),
                }
            }

            /// The hook's shortcut answers as [`place`] does: whenever it
            /// says home, `place` says home too (with or without
            /// `--fleet*` options, which it leaves to `place`).
            #[test]
            fn home_starts_now_agrees_with_place(home in arb_cluster("home"), a in arb_cluster("a"), b in arb_cluster("b"), job in arb_job(), plain in any::<bool>()) {
                let mut job = job;
                if plain {
                    job.fleet = FleetOptions::default();
                }
                let view = FleetView { generated_at: 0.0, clusters: vec![a, home.clone(), b] };
                let quick = home_starts_now(&view, &job);
                let (p, _) = place(&view, &job);
                if quick {
                    prop_assert!(matches!(p, Placement::Home { .. }), "{p:?}");
                }
                // And it is not a shortcut that never fires: a plain job
                // the origin runs and has the GPUs for now is answered by it.
                let free_now = fits(&home, &job).is_ok() && free_matching(&home, &job) >= job.total_gpus();
                prop_assert_eq!(quick, job.fleet == FleetOptions::default() && free_now);
            }
        }
    }
}
