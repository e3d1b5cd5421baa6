//! Typed `gres.conf`: which GRES (GPUs) each node has.
//!
//! Lines look like `NodeName=gpu[01-02] Name=gpu Type=h100
//! File=/dev/nvidia[0-7] Cores=0-15`. `NodeName` and `File` are
//! hostlists. `Count` defaults to the number of `File`s (1 without
//! `File`); a `Count` that disagrees with the files is a warning. A
//! line without `NodeName` applies to every node. Global keys
//! (`AutoDetect=off`) are kept in [`GresConf::settings`].

use std::path::Path;

use crate::diag::{Diagnostic, Error, Loaded};
use crate::hostlist::Budget;
use crate::raw::{self, Loader, Parsed};
use crate::slurm::Setting;
use crate::value::parse_count;

/// One `Name=` line (node list expanded).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GresLine {
    /// `None`: every node (the line had no `NodeName`).
    pub nodes: Option<Vec<String>>,
    pub name: String,
    pub gres_type: Option<String>,
    /// Device files, expanded.
    pub files: Vec<String>,
    /// Per node.
    pub count: u64,
    pub cores: Option<String>,
    pub links: Option<String>,
    pub flags: Option<String>,
    pub other: Vec<(String, String)>,
    pub file: String,
    pub line: u32,
}

impl GresLine {
    pub fn applies_to(&self, node: &str) -> bool {
        match &self.nodes {
            None => true,
            Some(ns) => ns.iter().any(|n| n == node),
        }
    }
}

/// The typed gres.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GresConf {
    pub lines: Vec<GresLine>,
    /// Global keys such as `AutoDetect`.
    pub settings: Vec<Setting>,
}

impl GresConf {
    pub fn parse_str(text: &str, origin: &str) -> Result<Loaded<GresConf>, Error> {
        Self::from_parsed(raw::parse_str(text, origin))
    }

    pub fn load(path: &Path) -> Result<Loaded<GresConf>, Error> {
        Self::load_with(path, &mut raw::FsLoader)
    }

    pub fn load_with(path: &Path, loader: &mut dyn Loader) -> Result<Loaded<GresConf>, Error> {
        Self::from_parsed(raw::load_with(path, loader)?)
    }

    pub fn from_parsed(parsed: Parsed) -> Result<Loaded<GresConf>, Error> {
        let mut diags = parsed.diagnostics;
        let mut conf = GresConf::default();
        let mut budget = Budget::default();
        for e in &parsed.entries {
            let is_line = e.get("Name").is_some();
            if !is_line {
                if e.get("NodeName").is_some() {
                    diags.push(Diagnostic::error(&e.file, e.line, "NodeName line without Name="));
                    continue;
                }
                for (k, v) in &e.pairs {
                    conf.settings.push(Setting {
                        key: k.clone(),
                        value: v.clone(),
                        file: e.file.clone(),
                        line: e.line,
                    });
                }
                continue;
            }
            let bad =
                |k: &str, v: &str, why: &str| Diagnostic::error(&e.file, e.line, format!("{k}={v}: bad value; {why}"));
            let mut l = GresLine { file: e.file.clone(), line: e.line, ..GresLine::default() };
            let mut count: Option<u64> = None;
            let before = diags.len();
            for (k, v) in &e.pairs {
                match k.to_ascii_lowercase().as_str() {
                    "nodename" => match budget.expand(v) {
                        Ok(ns) => l.nodes = Some(ns),
                        Err(err) => diags.push(bad(k, v, &err)),
                    },
                    "name" => {
                        if v.is_empty() {
                            diags.push(bad(k, v, "expected a GRES name such as gpu"));
                        }
                        l.name = v.clone();
                    }
                    "type" => l.gres_type = Some(v.clone()).filter(|t| !t.is_empty()),
                    "file" | "files" => match budget.expand(v) {
                        Ok(fs) => l.files = fs,
                        Err(err) => diags.push(bad(k, v, &err)),
                    },
                    "count" => match parse_count(v) {
                        Ok(c) => count = Some(c),
                        Err(why) => diags.push(bad(k, v, &format!("count {why}"))),
                    },
                    "cores" | "cpus" => l.cores = Some(v.clone()),
                    "links" => l.links = Some(v.clone()),
                    "flags" => l.flags = Some(v.clone()),
                    _ => l.other.push((k.clone(), v.clone())),
                }
            }
            if diags[before..].iter().any(|d| d.is_error()) {
                continue;
            }
            let from_files = l.files.len() as u64;
            l.count = match count {
                Some(c) => {
                    if from_files > 0 && c != from_files && l.name.eq_ignore_ascii_case("gpu") {
                        diags.push(Diagnostic::warning(
                            &e.file,
                            e.line,
                            format!("Count={c} but File= names {from_files} devices"),
                        ));
                    }
                    c
                }
                None if from_files > 0 => from_files,
                None => 1,
            };
            conf.lines.push(l);
        }
        if let Some(e) = Error::from_diagnostics(&diags) {
            return Err(e);
        }
        Ok(Loaded { conf, warnings: diags })
    }

    /// GRES `name` on `node`: `(type, count)` per matching line.
    pub fn on_node(&self, node: &str, name: &str) -> Vec<(Option<&str>, u64)> {
        self.lines
            .iter()
            .filter(|l| l.name.eq_ignore_ascii_case(name) && l.applies_to(node))
            .map(|l| (l.gres_type.as_deref(), l.count))
            .collect()
    }

    /// GPUs on `node`: `(type, count)` per matching line.
    pub fn gpus_on(&self, node: &str) -> Vec<(Option<&str>, u64)> {
        self.on_node(node, "gpu")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Result<&[&str], &[&str]>) {
        let got = GresConf::parse_str(input, "gres.conf");
        match (got, expected) {
            (Ok(l), Ok(want)) => {
                let mut got: Vec<String> = l
                    .conf
                    .lines
                    .iter()
                    .map(|g| {
                        format!(
                            "{} {}:{} x{} files={} cores={:?}",
                            g.nodes.as_ref().map_or("*".to_string(), |n| n.join(",")),
                            g.name,
                            g.gres_type.as_deref().unwrap_or("-"),
                            g.count,
                            g.files.len(),
                            g.cores
                        )
                    })
                    .collect();
                got.extend(l.conf.settings.iter().map(|s| format!("set {}={}", s.key, s.value)));
                got.extend(l.warnings.iter().map(|w| format!("warn {w}")));
                assert_eq!(got, want, "input {input:?}");
            }
            (Err(e), Err(errs)) => {
                let got: Vec<String> = e.diagnostics().iter().map(|d| d.to_string()).collect();
                assert_eq!(got, errs, "input {input:?}");
            }
            (got, want) => panic!("input {input:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn gres_conf_table() {
        check(
            "AutoDetect=off\nNodeName=gpu[01-02] Name=gpu Type=h100 File=/dev/nvidia[0-7] Cores=0-15",
            Ok(&["gpu01,gpu02 gpu:h100 x8 files=8 cores=Some(\"0-15\")", "set AutoDetect=off"]),
        );
        check("Name=gpu Type=a100 Count=4", Ok(&["* gpu:a100 x4 files=0 cores=None"]));
        check("Name=gpu", Ok(&["* gpu:- x1 files=0 cores=None"]));
        check("Name=shard Count=64 File=/dev/nvidia0", Ok(&["* shard:- x64 files=1 cores=None"]));
        check(
            "NodeName=n1 Name=gpu File=/dev/nvidia[0-3] Count=8",
            Ok(&["n1 gpu:- x8 files=4 cores=None", "warn gres.conf:1: Count=8 but File= names 4 devices"]),
        );
        check("NodeName=n1 Name=gpu Count=x", Err(&["gres.conf:1: Count=x: bad value; count is not a number"]));
        check(
            "NodeName=n1 Name=gpu File=/dev/nvidia[3-0]",
            Err(&["gres.conf:1: File=/dev/nvidia[3-0]: bad value; range \"3-0\" goes down (3 > 0)"]),
        );
        check("NodeName=n1 Type=h100", Err(&["gres.conf:1: NodeName line without Name="]));
    }

    #[test]
    fn gpus_on_node() {
        let l = GresConf::parse_str(
            "NodeName=a[1-2] Name=gpu Type=h100 File=/d/n[0-7]\nNodeName=a2 Name=gpu Type=a100 Count=2\nName=mps Count=100",
            "g",
        )
        .unwrap();
        assert_eq!(l.conf.gpus_on("a1"), vec![(Some("h100"), 8)]);
        assert_eq!(l.conf.gpus_on("a2"), vec![(Some("h100"), 8), (Some("a100"), 2)]);
        assert_eq!(l.conf.gpus_on("zz"), vec![]);
        assert_eq!(l.conf.on_node("zz", "mps"), vec![(None, 100)]);
    }
}
