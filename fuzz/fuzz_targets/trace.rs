#![no_main]
//! The simulator's trace readers (`fleet_sim::trace::read_philly` for
//! Philly's CSV table, `read_generic` for the generic CSV; the first input byte
//! picks one and whether bad rows are skipped): never panic; every job
//! they return has a finite submit time >= 0 (the first is 0), a finite
//! duration within the limit, and ids 0..n in submission order.
use fleet_sim::trace::{read_generic, read_philly, ReadOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let opts = ReadOptions { skip_invalid: sel & 2 != 0, ..Default::default() };
    let got = if sel & 1 == 0 { read_philly(body, "fuzz", &opts) } else { read_generic(body, "fuzz", &opts) };
    let Ok(t) = got else { return };
    let mut last = 0.0;
    for (i, j) in t.jobs.iter().enumerate() {
        assert_eq!(j.id, i);
        assert!(j.submit_s.is_finite() && j.submit_s >= last, "{j:?}");
        assert!(j.duration_s.is_finite() && j.duration_s >= 0.0 && j.duration_s <= opts.max_duration_s, "{j:?}");
        last = j.submit_s;
    }
    if let Some(first) = t.jobs.first() {
        assert_eq!(first.submit_s, 0.0);
    }
    assert_eq!(t.skipped, t.diagnostics.len());
});
