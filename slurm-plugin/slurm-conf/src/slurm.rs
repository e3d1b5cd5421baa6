//! Typed `slurm.conf`: cluster name, ports, nodes and partitions, as
//! the agent needs them; every other key is kept raw with file:line.
//!
//! * `NodeName=DEFAULT …` / `PartitionName=DEFAULT …` set defaults for
//!   the lines after them (later DEFAULT lines add to / override them).
//! * Node names are hostlists (`NodeName=gpu[01-16]`); `NodeHostname`,
//!   `NodeAddr` and `Port` may be hostlists too, with one value for
//!   every node or a single value for all.
//! * Partition `Nodes=` are hostlists; `ALL` means every node defined.
//! * A node or partition line that cannot be understood is an error
//!   (file:line, key, value); unknown nodes in a partition are warnings.
//! * Hostile sizes: all hostlists of one file together expand to at most
//!   [`crate::hostlist::MAX_NAMES`] names, each node's copied fields
//!   counted too (so a node line's nodes × fields must stay under it).

use std::path::Path;

use crate::diag::{Diagnostic, Error, Loaded};
use std::collections::HashSet;

use crate::hostlist::Budget;
use crate::raw::{self, Entry, Loader, Parsed};
use crate::value::{parse_bool, parse_count, parse_time_minutes};

/// One item of a `Gres=` list: `gpu:h100:8` → name gpu, type h100, 8.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GresSpec {
    pub name: String,
    pub gres_type: Option<String>,
    pub count: u64,
}

/// A time limit (`MaxTime`, `DefaultTime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeLimit {
    Unlimited,
    Minutes(u32),
}

/// One node (after hostlist expansion and DEFAULT merging).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDef {
    pub name: String,
    pub hostname: Option<String>,
    pub addr: Option<String>,
    pub port: Option<u16>,
    pub cpus: Option<u32>,
    pub boards: Option<u32>,
    pub sockets: Option<u32>,
    pub cores_per_socket: Option<u32>,
    pub threads_per_core: Option<u32>,
    /// MB.
    pub real_memory: Option<u64>,
    pub gres: Vec<GresSpec>,
    pub features: Vec<String>,
    pub weight: Option<u32>,
    pub state: Option<String>,
    /// Other keys of the line (and of the DEFAULT lines before it).
    pub other: Vec<(String, String)>,
    pub file: String,
    pub line: u32,
}

impl NodeDef {
    /// GPUs on this node: `(type, count)` for each `gpu` item of `Gres=`.
    pub fn gpus(&self) -> Vec<(Option<&str>, u64)> {
        self.gres
            .iter()
            .filter(|g| g.name.eq_ignore_ascii_case("gpu"))
            .map(|g| (g.gres_type.as_deref(), g.count))
            .collect()
    }
}

/// One partition (after DEFAULT merging).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionDef {
    pub name: String,
    /// Expanded node names, in order.
    pub nodes: Vec<String>,
    pub default: bool,
    pub max_time: Option<TimeLimit>,
    pub default_time: Option<TimeLimit>,
    /// `State=` as written, upper-cased (UP, DOWN, DRAIN, INACTIVE).
    pub state: Option<String>,
    pub other: Vec<(String, String)>,
    pub file: String,
    pub line: u32,
}

/// A top-level `Key=Value` kept as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub key: String,
    pub value: String,
    pub file: String,
    pub line: u32,
}

/// The typed slurm.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlurmConf {
    pub cluster_name: Option<String>,
    /// `SlurmctldHost` lines in order (primary first); the value may be
    /// `host(addr)` as written. `ControlMachine` counts too.
    pub slurmctld_hosts: Vec<String>,
    /// First port of `SlurmctldPort` (which may be a range `6817-6818`).
    pub slurmctld_port: Option<u16>,
    pub slurmd_port: Option<u16>,
    pub slurm_user: Option<String>,
    /// `GresTypes=gpu,shard`.
    pub gres_types: Vec<String>,
    pub nodes: Vec<NodeDef>,
    pub partitions: Vec<PartitionDef>,
    /// Every other top-level key, in order.
    pub other: Vec<Setting>,
    /// Record lines of other kinds (`NodeSet=`, `DownNodes=`, …), raw.
    pub other_entries: Vec<Entry>,
}

impl SlurmConf {
    /// Parses slurm.conf text (`Include` is not followed).
    pub fn parse_str(text: &str, origin: &str) -> Result<Loaded<SlurmConf>, Error> {
        Self::from_parsed(raw::parse_str(text, origin))
    }

    /// Reads a slurm.conf and its `Include`s from the file system.
    pub fn load(path: &Path) -> Result<Loaded<SlurmConf>, Error> {
        Self::load_with(path, &mut raw::FsLoader)
    }

    /// [`SlurmConf::load`] through an injectable loader.
    pub fn load_with(path: &Path, loader: &mut dyn Loader) -> Result<Loaded<SlurmConf>, Error> {
        Self::from_parsed(raw::load_with(path, loader)?)
    }

    /// The typed config from raw entries.
    pub fn from_parsed(parsed: Parsed) -> Result<Loaded<SlurmConf>, Error> {
        let mut diags = parsed.diagnostics;
        let mut conf = SlurmConf::default();
        let mut node_defaults: Vec<(String, String)> = Vec::new();
        let mut part_defaults: Vec<(String, String)> = Vec::new();
        let mut pending_parts: Vec<(&Entry, Vec<(String, String)>)> = Vec::new();
        let mut budget = Budget::default();
        for e in &parsed.entries {
            let (head, value) = e.head();
            if head.eq_ignore_ascii_case("NodeName") {
                if value.eq_ignore_ascii_case("DEFAULT") {
                    merge(&mut node_defaults, &e.pairs[1..]);
                } else {
                    let mut pairs = node_defaults.clone();
                    merge(&mut pairs, &e.pairs[1..]);
                    nodes_from(e, value, &pairs, &mut conf.nodes, &mut diags, &mut budget);
                }
            } else if head.eq_ignore_ascii_case("PartitionName") {
                if value.eq_ignore_ascii_case("DEFAULT") {
                    merge(&mut part_defaults, &e.pairs[1..]);
                } else {
                    let mut pairs = part_defaults.clone();
                    merge(&mut pairs, &e.pairs[1..]);
                    // Partitions may name nodes defined later: resolve after.
                    pending_parts.push((e, pairs));
                }
            } else if ["NodeSet", "DownNodes", "FrontendName", "SwitchName"]
                .iter()
                .any(|k| head.eq_ignore_ascii_case(k))
            {
                conf.other_entries.push(e.clone());
            } else {
                for (k, v) in &e.pairs {
                    top_level(&mut conf, e, k, v, &mut diags);
                }
            }
        }
        // Duplicate node names (reported at the later definition).
        let mut known: HashSet<&str> = HashSet::with_capacity(conf.nodes.len());
        for n in &conf.nodes {
            if !known.insert(n.name.as_str()) {
                diags.push(Diagnostic::error(&n.file, n.line, format!("node {} defined more than once", n.name)));
            }
        }
        let mut part_names: HashSet<String> = HashSet::new();
        for (e, pairs) in pending_parts {
            if let Some(p) = partition_from(e, &pairs, &conf.nodes, &known, &mut diags, &mut budget) {
                if !part_names.insert(p.name.clone()) {
                    diags.push(Diagnostic::error(
                        &e.file,
                        e.line,
                        format!("partition {} defined more than once", p.name),
                    ));
                }
                conf.partitions.push(p);
            }
        }
        let defaults: Vec<&PartitionDef> = conf.partitions.iter().filter(|p| p.default).collect();
        if defaults.len() > 1 {
            let p = defaults[defaults.len() - 1];
            diags.push(Diagnostic::warning(
                &p.file,
                p.line,
                format!("more than one Default=YES partition; Slurm uses the last one ({})", p.name),
            ));
        }
        if let Some(e) = Error::from_diagnostics(&diags) {
            return Err(e);
        }
        Ok(Loaded { conf, warnings: diags })
    }

    pub fn node(&self, name: &str) -> Option<&NodeDef> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn partition(&self, name: &str) -> Option<&PartitionDef> {
        self.partitions.iter().find(|p| p.name == name)
    }

    /// The `Default=YES` partition (the last one, as Slurm), if any.
    pub fn default_partition(&self) -> Option<&PartitionDef> {
        self.partitions.iter().rev().find(|p| p.default)
    }

    /// A top-level key not otherwise typed (last value wins).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.other.iter().rev().find(|s| s.key.eq_ignore_ascii_case(key)).map(|s| s.value.as_str())
    }
}

/// Sets/overrides `pairs` by key (case-insensitive).
fn merge(into: &mut Vec<(String, String)>, pairs: &[(String, String)]) {
    for (k, v) in pairs {
        match into.iter_mut().find(|(ek, _)| ek.eq_ignore_ascii_case(k)) {
            Some(slot) => *slot = (k.clone(), v.clone()),
            None => into.push((k.clone(), v.clone())),
        }
    }
}

fn bad(e: &Entry, k: &str, v: &str, expect: &str) -> Diagnostic {
    Diagnostic::error(&e.file, e.line, format!("{k}={v}: bad value; {expect}"))
}

fn top_level(conf: &mut SlurmConf, e: &Entry, k: &str, v: &str, diags: &mut Vec<Diagnostic>) {
    let lk = k.to_ascii_lowercase();
    match lk.as_str() {
        "clustername" => conf.cluster_name = Some(v.to_string()),
        "slurmctldhost" | "controlmachine" => conf.slurmctld_hosts.push(v.to_string()),
        "slurmctldport" => {
            let first = v.split('-').next().unwrap_or("");
            match first.parse::<u16>() {
                Ok(p) if p > 0 => conf.slurmctld_port = Some(p),
                _ => diags.push(bad(e, k, v, "expected a port (1..65535) or a range like 6817-6818")),
            }
        }
        "slurmdport" => match v.parse::<u16>() {
            Ok(p) if p > 0 => conf.slurmd_port = Some(p),
            _ => diags.push(bad(e, k, v, "expected a port (1..65535)")),
        },
        "slurmuser" => conf.slurm_user = Some(v.to_string()),
        "grestypes" => {
            conf.gres_types = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
        }
        _ => {
            if let Some(prev) = conf.other.iter().find(|s| s.key.eq_ignore_ascii_case(k)) {
                diags.push(Diagnostic::warning(
                    &e.file,
                    e.line,
                    format!("{k} repeated (first at {}:{}); this value wins", prev.file, prev.line),
                ));
            }
            conf.other.push(Setting { key: k.to_string(), value: v.to_string(), file: e.file.clone(), line: e.line });
        }
    }
}

/// Expands a per-node value list: one value for all, or one per node.
fn per_node(
    e: &Entry,
    k: &str,
    v: &str,
    n: usize,
    diags: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) -> Option<Vec<String>> {
    match budget.expand(v) {
        Ok(vals) if vals.len() == 1 => Some(vec![vals[0].clone(); n]),
        Ok(vals) if vals.len() == n => Some(vals),
        Ok(vals) => {
            diags.push(bad(e, k, v, &format!("expected 1 or {n} values (one per node), found {}", vals.len())));
            None
        }
        Err(err) => {
            diags.push(bad(e, k, v, &err));
            None
        }
    }
}

fn nodes_from(
    e: &Entry,
    names: &str,
    pairs: &[(String, String)],
    out: &mut Vec<NodeDef>,
    diags: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) {
    let names = match budget.expand(names) {
        Ok(n) if !n.is_empty() => n,
        Ok(_) => {
            diags.push(bad(e, "NodeName", names, "expected node names"));
            return;
        }
        Err(err) => {
            diags.push(bad(e, "NodeName", names, &err));
            return;
        }
    };
    let n = names.len();
    // Each node copies the line's fields: charge them too.
    if let Err(err) = budget.charge(n.saturating_mul(pairs.len())) {
        diags.push(bad(e, "NodeName", names_expr(e), &err));
        return;
    }
    let mut template = NodeDef { file: e.file.clone(), line: e.line, ..NodeDef::default() };
    let mut hostnames = None;
    let mut addrs = None;
    let mut ports: Option<Vec<u16>> = None;
    let mut ok = true;
    for (k, v) in pairs {
        let before = diags.len();
        match k.to_ascii_lowercase().as_str() {
            "nodehostname" => hostnames = per_node(e, k, v, n, diags, budget),
            "nodeaddr" => addrs = per_node(e, k, v, n, diags, budget),
            "port" => {
                if let Some(ps) = per_node(e, k, v, n, diags, budget) {
                    match ps.iter().map(|p| p.parse::<u16>().ok().filter(|&p| p > 0)).collect::<Option<Vec<_>>>() {
                        Some(ps) => ports = Some(ps),
                        None => diags.push(bad(e, k, v, "expected ports (1..65535)")),
                    }
                }
            }
            "cpus" | "procs" => template.cpus = num32(e, k, v, diags),
            "boards" => template.boards = num32(e, k, v, diags),
            "sockets" => template.sockets = num32(e, k, v, diags),
            "corespersocket" => template.cores_per_socket = num32(e, k, v, diags),
            "threadspercore" => template.threads_per_core = num32(e, k, v, diags),
            "weight" => template.weight = num32(e, k, v, diags),
            "realmemory" => match v.parse::<u64>() {
                Ok(m) => template.real_memory = Some(m),
                Err(_) => diags.push(bad(e, k, v, "expected megabytes (a whole number)")),
            },
            "gres" => match parse_gres_list(v) {
                Ok(g) => template.gres = g,
                Err(why) => diags.push(bad(e, k, v, &why)),
            },
            "features" | "feature" | "availablefeatures" => {
                template.features = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
            }
            "state" => template.state = Some(v.to_ascii_uppercase()),
            _ => template.other.push((k.clone(), v.clone())),
        }
        ok &= diags.len() == before;
    }
    if !ok {
        return;
    }
    for (i, name) in names.into_iter().enumerate() {
        let mut node = template.clone();
        node.name = name;
        node.hostname = hostnames.as_ref().and_then(|h| h.get(i).cloned());
        node.addr = addrs.as_ref().and_then(|a| a.get(i).cloned());
        node.port = ports.as_ref().and_then(|p| p.get(i).copied());
        out.push(node);
    }
}

fn num32(e: &Entry, k: &str, v: &str, diags: &mut Vec<Diagnostic>) -> Option<u32> {
    match v.parse::<u32>() {
        Ok(n) => Some(n),
        Err(_) => {
            diags.push(bad(e, k, v, "expected a whole number"));
            None
        }
    }
}

fn names_expr(e: &Entry) -> &str {
    e.head().1
}

fn partition_from(
    e: &Entry,
    pairs: &[(String, String)],
    nodes: &[NodeDef],
    known: &HashSet<&str>,
    diags: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) -> Option<PartitionDef> {
    let (_, name) = e.head();
    if name.is_empty() {
        diags.push(bad(e, "PartitionName", name, "expected a partition name"));
        return None;
    }
    let mut p = PartitionDef { name: name.to_string(), file: e.file.clone(), line: e.line, ..PartitionDef::default() };
    let before = diags.len();
    for (k, v) in pairs {
        match k.to_ascii_lowercase().as_str() {
            "nodes" => {
                if v.eq_ignore_ascii_case("ALL") {
                    if let Err(err) = budget.charge(nodes.len()) {
                        diags.push(bad(e, k, v, &err));
                    } else {
                        p.nodes = nodes.iter().map(|n| n.name.clone()).collect();
                    }
                } else {
                    match budget.expand(v) {
                        Ok(list) => {
                            let unknown: Vec<&String> = list.iter().filter(|n| !known.contains(n.as_str())).collect();
                            if !unknown.is_empty() {
                                let names: Vec<&str> = unknown.iter().take(10).map(|s| s.as_str()).collect();
                                let more = if unknown.len() > 10 {
                                    format!(" and {} more", unknown.len() - 10)
                                } else {
                                    String::new()
                                };
                                let (what, verb) = if unknown.len() == 1 { ("node", "is") } else { ("nodes", "are") };
                                diags.push(Diagnostic::warning(
                                    &e.file,
                                    e.line,
                                    format!(
                                        "partition {name}: {what} {}{more} {verb} not defined by a NodeName line",
                                        names.join(",")
                                    ),
                                ));
                            }
                            p.nodes = list;
                        }
                        Err(err) => diags.push(bad(e, k, v, &err)),
                    }
                }
            }
            "default" => match parse_bool(v) {
                Some(b) => p.default = b,
                None => diags.push(bad(e, k, v, "expected YES or NO")),
            },
            "maxtime" => match parse_time_minutes(v) {
                Ok(t) => p.max_time = Some(t.map_or(TimeLimit::Unlimited, TimeLimit::Minutes)),
                Err(why) => diags.push(bad(e, k, v, &why)),
            },
            "defaulttime" => match parse_time_minutes(v) {
                Ok(t) => p.default_time = Some(t.map_or(TimeLimit::Unlimited, TimeLimit::Minutes)),
                Err(why) => diags.push(bad(e, k, v, &why)),
            },
            "state" => {
                let s = v.to_ascii_uppercase();
                if ["UP", "DOWN", "DRAIN", "INACTIVE"].contains(&s.as_str()) {
                    p.state = Some(s);
                } else {
                    diags.push(bad(e, k, v, "expected UP, DOWN, DRAIN or INACTIVE"));
                }
            }
            _ => p.other.push((k.clone(), v.clone())),
        }
    }
    let failed = diags[before..].iter().any(|d| d.is_error());
    (!failed).then_some(p)
}

/// A `Gres=` list as in slurm.conf node lines: `gpu:h100:8,shard:16`,
/// `gpu:2`, `gpu` (count 1), `gpu:h100:8(S:0-1)` (the socket part is
/// dropped). Counts may carry k/m/g/t/p suffixes. Err is the reason.
/// Whether an `AccountingStorageEnforce` value makes slurmctld apply QOS
/// or association limits (a `MaxWall` among them) to jobs: `limits`, `qos`,
/// `safe` (which implies `limits`) or `all`.
pub fn enforces_limits(value: &str) -> bool {
    value.split(',').any(|w| ["limits", "qos", "safe", "all"].contains(&w.trim().to_ascii_lowercase().as_str()))
}

pub fn parse_gres_list(v: &str) -> Result<Vec<GresSpec>, String> {
    let mut out = Vec::new();
    for item in split_gres(v) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let core = item.split('(').next().unwrap_or(item);
        let fields: Vec<&str> = core.split(':').collect();
        let count_of = |c: &str| parse_count(c).map_err(|why| format!("count \"{c}\" in \"{item}\" {why}"));
        let (name, gres_type, count) = match fields.as_slice() {
            [n] => (*n, None, 1),
            [n, c] if c.starts_with(|ch: char| ch.is_ascii_digit()) => (*n, None, count_of(c)?),
            [n, t] => (*n, Some(*t), 1),
            [n, t, c] => (*n, Some(*t), count_of(c)?),
            _ => return Err(format!("\"{item}\": expected name[:type][:count]")),
        };
        if name.is_empty() || gres_type == Some("") {
            return Err(format!("\"{item}\": expected name[:type][:count]"));
        }
        out.push(GresSpec { name: name.to_string(), gres_type: gres_type.map(str::to_string), count });
    }
    Ok(out)
}

/// Splits at commas outside parentheses (`gpu:2(S:0,1)` stays whole).
fn split_gres(v: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in v.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Result<&str, &[&str]>) {
        let got = SlurmConf::parse_str(input, "slurm.conf");
        match (got, expected) {
            (Ok(l), Ok(want)) => assert_eq!(summary(&l), want, "input {input:?}"),
            (Err(e), Err(errs)) => {
                let got: Vec<String> = e.diagnostics().iter().map(|d| d.to_string()).collect();
                assert_eq!(got, errs, "input {input:?}");
            }
            (got, want) => panic!("input {input:?}: got {got:?}, want {want:?}"),
        }
    }

    /// One line per node / partition / warning, compact.
    fn summary(l: &Loaded<SlurmConf>) -> String {
        let c = &l.conf;
        let mut s = format!("cluster={:?} port={:?}", c.cluster_name, c.slurmctld_port);
        for n in &c.nodes {
            let gres: Vec<String> = n
                .gres
                .iter()
                .map(|g| format!("{}:{}:{}", g.name, g.gres_type.as_deref().unwrap_or("-"), g.count))
                .collect();
            s += &format!(
                "\nnode {} cpus={:?} mem={:?} port={:?} addr={:?} gres={} feat={} @{}",
                n.name,
                n.cpus,
                n.real_memory,
                n.port,
                n.addr,
                gres.join(","),
                n.features.join(","),
                n.line
            );
        }
        for p in &c.partitions {
            s += &format!(
                "\npart {} nodes={} default={} max={:?} state={:?}",
                p.name,
                p.nodes.join(","),
                p.default,
                p.max_time,
                p.state
            );
        }
        for w in &l.warnings {
            s += &format!("\nwarn {w}");
        }
        s
    }

    #[test]
    fn slurm_conf_table() {
        check(
            "ClusterName=alpha\nSlurmctldPort=6817-6818\n\
             NodeName=DEFAULT CPUs=32 RealMemory=64000 Gres=gpu:h100:8\n\
             NodeName=gpu[01-02] NodeAddr=127.0.0.1 Port=[7001-7002] Features=ib,nvlink\n\
             NodeName=cpu1 CPUs=8 Gres=\n\
             PartitionName=DEFAULT State=UP\n\
             PartitionName=gpu Nodes=gpu[01-02] Default=YES MaxTime=1-00:00:00\n\
             PartitionName=all Nodes=ALL MaxTime=INFINITE",
            Ok("cluster=Some(\"alpha\") port=Some(6817)\n\
                node gpu01 cpus=Some(32) mem=Some(64000) port=Some(7001) addr=Some(\"127.0.0.1\") gres=gpu:h100:8 feat=ib,nvlink @4\n\
                node gpu02 cpus=Some(32) mem=Some(64000) port=Some(7002) addr=Some(\"127.0.0.1\") gres=gpu:h100:8 feat=ib,nvlink @4\n\
                node cpu1 cpus=Some(8) mem=Some(64000) port=None addr=None gres= feat= @5\n\
                part gpu nodes=gpu01,gpu02 default=true max=Some(Minutes(1440)) state=Some(\"UP\")\n\
                part all nodes=gpu01,gpu02,cpu1 default=false max=Some(Unlimited) state=Some(\"UP\")"),
        );
        check(
            "nodename=n1 gres=gpu:2,shard:8(S:0-1),gpu:a100:1k\npartitionname=p nodes=n[1-2]",
            Ok("cluster=None port=None\n\
                node n1 cpus=None mem=None port=None addr=None gres=gpu:-:2,shard:-:8,gpu:a100:1024 feat= @1\n\
                part p nodes=n1,n2 default=false max=None state=None\n\
                warn slurm.conf:2: partition p: node n2 is not defined by a NodeName line"),
        );
        check("MinJobAge=1\nMinJobAge=2", Ok("cluster=None port=None\nwarn slurm.conf:2: MinJobAge repeated (first at slurm.conf:1); this value wins"));
        // Errors.
        check(
            "NodeName=n[3-1] CPUs=4",
            Err(&["slurm.conf:1: NodeName=n[3-1]: bad value; range \"3-1\" goes down (3 > 1)"]),
        );
        check("NodeName=n1 CPUs=four", Err(&["slurm.conf:1: CPUs=four: bad value; expected a whole number"]));
        check(
            "NodeName=n[1-3] Port=[1-2]",
            Err(&["slurm.conf:1: Port=[1-2]: bad value; expected 1 or 3 values (one per node), found 2"]),
        );
        check("NodeName=n1 Port=99999", Err(&["slurm.conf:1: Port=99999: bad value; expected ports (1..65535)"]));
        check(
            "NodeName=n1 Gres=gpu:h100:x",
            Err(&["slurm.conf:1: Gres=gpu:h100:x: bad value; count \"x\" in \"gpu:h100:x\" is not a number"]),
        );
        check("NodeName=n1\nNodeName=n1", Err(&["slurm.conf:2: node n1 defined more than once"]));
        check("PartitionName=p MaxTime=soon", Err(&["slurm.conf:1: MaxTime=soon: bad value; \"soon\" is not a time limit (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED)"]));
        check(
            "PartitionName=p Default=maybe State=UP",
            Err(&["slurm.conf:1: Default=maybe: bad value; expected YES or NO"]),
        );
        check(
            "NodeName=n[1-600000]\nNodeName=m[1-600000]",
            Err(&["slurm.conf:2: NodeName=m[1-600000]: bad value; expands to more than 400000 names (the file's total is capped at 1000000 names)"]),
        );
        check(
            "SlurmctldPort=x",
            Err(&["slurm.conf:1: SlurmctldPort=x: bad value; expected a port (1..65535) or a range like 6817-6818"]),
        );
    }

    /// The shape tests/lab/lab.sh writes (one NodeName line per node).
    #[test]
    fn lab_style_conf() {
        let text = "# Generated by tests/lab/lab.sh — cluster alpha\nClusterName=alpha\nSlurmctldHost=localhost\n\
            SlurmctldPort=16817\nSlurmdSpoolDir=/tmp/fleet-lab/alpha/spool/%n\nGresTypes=gpu\n\
            PluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm:/tmp/fleet-lab/plugins\nJobSubmitPlugins=fleet\n\
            NodeName=alpha1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001 CPUs=32 RealMemory=64000 Gres=gpu:h100:8 State=UNKNOWN\n\
            NodeName=alpha2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17002 CPUs=32 RealMemory=64000 Gres=gpu:h100:8 State=UNKNOWN\n\
            PartitionName=gpu Nodes=alpha1,alpha2 Default=YES MaxTime=INFINITE State=UP\n\
            PartitionName=fleet Nodes=alpha1,alpha2 OverSubscribe=FORCE:64 MaxTime=INFINITE State=UP\n";
        let l = SlurmConf::parse_str(text, "alpha/slurm.conf").unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        let c = l.conf;
        assert_eq!(c.cluster_name.as_deref(), Some("alpha"));
        assert_eq!(c.slurmctld_port, Some(16817));
        assert_eq!(
            c.nodes.iter().map(|n| (n.name.as_str(), n.port)).collect::<Vec<_>>(),
            vec![("alpha1", Some(17001)), ("alpha2", Some(17002))]
        );
        assert_eq!(c.node("alpha2").unwrap().gpus(), vec![(Some("h100"), 8)]);
        assert_eq!(c.node("alpha2").unwrap().line, 10);
        assert_eq!(c.partition("fleet").unwrap().other, vec![("OverSubscribe".to_string(), "FORCE:64".to_string())]);
        assert_eq!(c.get("JobSubmitPlugins"), Some("fleet"));
    }

    #[test]
    fn lookups() {
        let l = SlurmConf::parse_str(
            "ClusterName=b\nSlurmctldHost=h1\nSlurmctldHost=h2\nGresTypes=gpu,shard\nMpiDefault=none\n\
             NodeName=b1 Gres=gpu:a100:8\nPartitionName=x Nodes=b1 Default=YES\nNodeSet=ns Feature=f",
            "s",
        )
        .unwrap();
        assert_eq!(l.conf.slurmctld_hosts, vec!["h1", "h2"]);
        assert_eq!(l.conf.gres_types, vec!["gpu", "shard"]);
        assert_eq!(l.conf.get("mpidefault"), Some("none"));
        assert_eq!(l.conf.node("b1").unwrap().gpus(), vec![(Some("a100"), 8)]);
        assert_eq!(l.conf.default_partition().unwrap().name, "x");
        assert_eq!(l.conf.other_entries.len(), 1);
    }
}
