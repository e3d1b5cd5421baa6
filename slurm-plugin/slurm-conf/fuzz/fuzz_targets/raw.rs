#![no_main]
//! The raw grammar never panics; every entry and diagnostic carries a
//! line within the input, and every entry has at least one pair.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lines = text.split('\n').count() as u32;
    let p = slurm_conf::raw::parse_str(&text, "fuzz.conf");
    for e in &p.entries {
        assert!(e.line >= 1 && e.line <= lines, "entry line {} of {}", e.line, lines);
        assert!(!e.pairs.is_empty());
    }
    for d in &p.diagnostics {
        assert!(d.line <= lines);
    }
});
