//! Typed `topology.conf` (topology/tree): switches, their nodes and
//! child switches. `SwitchName=s0 Nodes=gpu[01-08]`,
//! `SwitchName=top Switches=s[0-1]`; both lists are hostlists.
//!
//! Errors: a switch defined twice, a child switch never defined, a
//! switch that contains itself (cycle). A node under two leaf switches
//! is a warning.

use std::path::Path;

use crate::diag::{Diagnostic, Error, Loaded};
use std::collections::{HashMap, HashSet};

use crate::hostlist::Budget;
use crate::raw::{self, Loader, Parsed};

/// One switch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Switch {
    pub name: String,
    /// Nodes directly attached (leaf switches).
    pub nodes: Vec<String>,
    /// Child switch names.
    pub switches: Vec<String>,
    pub link_speed: Option<u64>,
    pub file: String,
    pub line: u32,
}

/// The switch tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub switches: Vec<Switch>,
}

impl Topology {
    pub fn parse_str(text: &str, origin: &str) -> Result<Loaded<Topology>, Error> {
        Self::from_parsed(raw::parse_str(text, origin))
    }

    pub fn load(path: &Path) -> Result<Loaded<Topology>, Error> {
        Self::load_with(path, &mut raw::FsLoader)
    }

    pub fn load_with(path: &Path, loader: &mut dyn Loader) -> Result<Loaded<Topology>, Error> {
        Self::from_parsed(raw::load_with(path, loader)?)
    }

    pub fn from_parsed(parsed: Parsed) -> Result<Loaded<Topology>, Error> {
        let mut diags = parsed.diagnostics;
        let mut topo = Topology::default();
        let mut budget = Budget::default();
        let mut index: HashMap<String, usize> = HashMap::new();
        for e in &parsed.entries {
            let (head, name) = e.head();
            if !head.eq_ignore_ascii_case("SwitchName") {
                diags.push(Diagnostic::warning(&e.file, e.line, format!("unknown key {head} (ignored)")));
                continue;
            }
            let bad =
                |k: &str, v: &str, why: &str| Diagnostic::error(&e.file, e.line, format!("{k}={v}: bad value; {why}"));
            if name.is_empty() {
                diags.push(bad("SwitchName", name, "expected a switch name"));
                continue;
            }
            if let Some(prev) = index.get(name).map(|&i| &topo.switches[i]) {
                diags.push(Diagnostic::error(
                    &e.file,
                    e.line,
                    format!("switch {name} already defined at {}:{}", prev.file, prev.line),
                ));
                continue;
            }
            let mut s = Switch { name: name.to_string(), file: e.file.clone(), line: e.line, ..Switch::default() };
            for (k, v) in &e.pairs[1..] {
                match k.to_ascii_lowercase().as_str() {
                    "nodes" => match budget.expand(v) {
                        Ok(ns) => s.nodes = ns,
                        Err(err) => diags.push(bad(k, v, &err)),
                    },
                    "switches" => match budget.expand(v) {
                        Ok(ss) => s.switches = ss,
                        Err(err) => diags.push(bad(k, v, &err)),
                    },
                    "linkspeed" => match v.parse::<u64>() {
                        Ok(n) => s.link_speed = Some(n),
                        Err(_) => diags.push(bad(k, v, "expected a whole number")),
                    },
                    _ => diags.push(Diagnostic::warning(&e.file, e.line, format!("unknown key {k} (ignored)"))),
                }
            }
            index.insert(s.name.clone(), topo.switches.len());
            topo.switches.push(s);
        }
        for s in &topo.switches {
            for c in &s.switches {
                if !index.contains_key(c) {
                    diags.push(Diagnostic::error(
                        &s.file,
                        s.line,
                        format!("switch {}: child switch {c} is not defined", s.name),
                    ));
                }
            }
        }
        for i in topo.cycle_members(&index) {
            let s = &topo.switches[i];
            diags.push(Diagnostic::error(&s.file, s.line, format!("switch {} contains itself (cycle)", s.name)));
        }
        let mut seen: HashMap<&str, &str> = HashMap::new();
        for s in &topo.switches {
            for n in &s.nodes {
                if let Some(other) = seen.get(n.as_str()) {
                    diags.push(Diagnostic::warning(
                        &s.file,
                        s.line,
                        format!("node {n} is under switches {other} and {}", s.name),
                    ));
                } else {
                    seen.insert(n, &s.name);
                }
            }
        }
        if let Some(e) = Error::from_diagnostics(&diags) {
            return Err(e);
        }
        Ok(Loaded { conf: topo, warnings: diags })
    }

    pub fn switch(&self, name: &str) -> Option<&Switch> {
        self.switches.iter().find(|s| s.name == name)
    }

    /// Indices of switches that are the target of a back edge in a
    /// depth-first walk (each cycle is reported once, at the switch where
    /// it closes). Iterative: deep trees cannot exhaust the stack.
    fn cycle_members(&self, index: &HashMap<String, usize>) -> Vec<usize> {
        // 0 = unvisited, 1 = on the current path, 2 = done.
        let mut color = vec![0u8; self.switches.len()];
        let mut found: Vec<usize> = Vec::new();
        for start in 0..self.switches.len() {
            if color[start] != 0 {
                continue;
            }
            // (switch, next child position)
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            color[start] = 1;
            while let Some(&mut (cur, ref mut pos)) = stack.last_mut() {
                let children = &self.switches[cur].switches;
                if *pos >= children.len() {
                    color[cur] = 2;
                    stack.pop();
                    continue;
                }
                let child = &children[*pos];
                *pos += 1;
                let Some(&ci) = index.get(child) else { continue };
                match color[ci] {
                    0 => {
                        color[ci] = 1;
                        stack.push((ci, 0));
                    }
                    1 if !found.contains(&ci) => found.push(ci),
                    _ => {}
                }
            }
        }
        found.sort_unstable();
        found
    }

    /// Switches that are nobody's child.
    pub fn roots(&self) -> Vec<&Switch> {
        self.switches.iter().filter(|s| !self.switches.iter().any(|p| p.switches.contains(&s.name))).collect()
    }

    /// The leaf switch `node` hangs off, if any.
    pub fn leaf_of(&self, node: &str) -> Option<&Switch> {
        self.switches.iter().find(|s| s.nodes.iter().any(|n| n == node))
    }

    /// Every node below `switch` (its own and its descendants'), in
    /// tree order, without duplicates.
    pub fn nodes_under(&self, switch: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut have: HashSet<&str> = HashSet::new();
        let mut visited: HashSet<&str> = HashSet::new();
        let mut stack = vec![switch];
        while let Some(cur) = stack.pop() {
            if !visited.insert(cur) {
                continue;
            }
            if let Some(s) = self.switch(cur) {
                for n in &s.nodes {
                    if have.insert(n) {
                        out.push(n.clone());
                    }
                }
                stack.extend(s.switches.iter().rev().map(String::as_str));
            }
        }
        out
    }

    /// Path of switch names from a root down to `node`'s leaf switch.
    pub fn path_to(&self, node: &str) -> Vec<&str> {
        let mut path = Vec::new();
        let mut cur = match self.leaf_of(node) {
            Some(s) => s,
            None => return path,
        };
        path.push(cur.name.as_str());
        while let Some(parent) = self.switches.iter().find(|p| p.switches.contains(&cur.name)) {
            if path.contains(&parent.name.as_str()) {
                break;
            }
            path.push(parent.name.as_str());
            cur = parent;
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Result<&[&str], &[&str]>) {
        let got = Topology::parse_str(input, "topology.conf");
        match (got, expected) {
            (Ok(l), Ok(want)) => {
                let mut got: Vec<String> = l
                    .conf
                    .switches
                    .iter()
                    .map(|s| format!("{} nodes={} switches={}", s.name, s.nodes.join(","), s.switches.join(",")))
                    .collect();
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
    fn topology_table() {
        check(
            "SwitchName=s0 Nodes=gpu[01-02] LinkSpeed=100\nSwitchName=s1 Nodes=gpu03\nSwitchName=top Switches=s[0-1]",
            Ok(&["s0 nodes=gpu01,gpu02 switches=", "s1 nodes=gpu03 switches=", "top nodes= switches=s0,s1"]),
        );
        check(
            "SwitchName=s0 Nodes=a1\nSwitchName=s1 Nodes=a1",
            Ok(&[
                "s0 nodes=a1 switches=",
                "s1 nodes=a1 switches=",
                "warn topology.conf:2: node a1 is under switches s0 and s1",
            ]),
        );
        check("SwitchName=top Switches=s9", Err(&["topology.conf:1: switch top: child switch s9 is not defined"]));
        check(
            "SwitchName=a Switches=b\nSwitchName=b Switches=a",
            Err(&["topology.conf:1: switch a contains itself (cycle)"]),
        );
        check(
            "SwitchName=top Switches=a\nSwitchName=a Switches=b\nSwitchName=b Switches=c\nSwitchName=c Switches=a,c",
            Err(&[
                "topology.conf:2: switch a contains itself (cycle)",
                "topology.conf:4: switch c contains itself (cycle)",
            ]),
        );
        check("SwitchName=a\nSwitchName=a", Err(&["topology.conf:2: switch a already defined at topology.conf:1"]));
        check(
            "SwitchName=a Nodes=x[2-1]",
            Err(&["topology.conf:1: Nodes=x[2-1]: bad value; range \"2-1\" goes down (2 > 1)"]),
        );
    }

    #[test]
    fn tree_queries() {
        let t = Topology::parse_str(
            "SwitchName=s0 Nodes=n[1-2]\nSwitchName=s1 Nodes=n[3-4]\nSwitchName=top Switches=s0,s1",
            "t",
        )
        .unwrap()
        .conf;
        assert_eq!(t.roots().iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), vec!["top"]);
        assert_eq!(t.nodes_under("top"), vec!["n1", "n2", "n3", "n4"]);
        assert_eq!(t.leaf_of("n3").unwrap().name, "s1");
        assert_eq!(t.path_to("n3"), vec!["top", "s1"]);
        assert!(t.path_to("zz").is_empty());
    }
}
