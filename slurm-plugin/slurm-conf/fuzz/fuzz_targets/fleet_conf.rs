#![no_main]
//! The typed FleetConf never panics; an error always names at least one
//! error diagnostic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = slurm_conf::FleetConf::parse_str(&text, "fuzz.conf") {
        assert!(!e.diagnostics().is_empty());
        assert!(e.to_string().starts_with("fuzz.conf"));
    }
});
