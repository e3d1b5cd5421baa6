#![no_main]
//! `metasched.toml` (`fleet_metasched::config::Config::parse`): never
//! panics; an error names the file; a config it accepts starts: its
//! limits and the rebalancing period become `Duration`s (as `run` does)
//! and cluster names are non-empty and unique.
use fleet_metasched::config::Config;
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let c = match Config::parse(text, Path::new("fuzz.toml")) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let _ = c.limits.resolve();
    if let Some(r) = &c.rebalance {
        let _ = std::time::Duration::from_secs_f64(r.rebalance_interval_s);
        let _ = r.margin();
    }
    let mut names: Vec<&str> = c.clusters.iter().map(|c| c.name.as_str()).collect();
    assert!(names.iter().all(|n| !n.is_empty()));
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(n, names.len());
    let _ = c.token_paths();
});
