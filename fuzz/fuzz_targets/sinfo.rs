#![no_main]
//! `sinfo -N -h -O <SINFO_FIELDS>` as the agent reads it (`parse_sinfo`,
//! `parse_gres_field`): never panics; one record per node name, with at
//! least one partition and never more free GPUs than GPUs.
use fleet_agent::slurm::{parse_gres_field, parse_sinfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (t, _) in parse_gres_field(&text) {
        assert!(t.is_none_or(|t| !t.contains(':') && !t.contains(',')), "GPU type with a separator");
    }
    let nodes = parse_sinfo(&text);
    let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(n, names.len(), "a node twice");
    for node in &nodes {
        assert!(!node.partitions.is_empty());
        assert!(node.gpus_free <= node.gpus_total, "{node:?}");
        assert!(!node.name.is_empty() && !node.name.contains(char::is_whitespace));
    }
});
