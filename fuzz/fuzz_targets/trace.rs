#![no_main]
//! The simulator's trace readers (`fleet_sim::trace::read_philly` for
//! Philly's CSV table, `read_generic` for the generic CSV; the first input byte
//! picks one and whether bad rows are skipped): never panic; every job
//! they return has a finite submit time >= 0 (the first is 0), a finite
//! duration within the limit, and ids 0..n in submission order.
//! With bit 2 of the first byte the input is Slurm accounting (`sacct
//! --parsable2`, `fleet_sim::convert::sacct_to_generic`), with bit 3 an
//! Alibaba openb pod list (`openb_to_generic`): whatever the converter
//! writes, the generic reader reads back, job for job.
use fleet_sim::convert::{openb_to_generic, sacct_to_generic, SacctOptions};
use fleet_sim::trace::{read_generic, read_philly, ReadOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let opts = ReadOptions { skip_invalid: sel & 2 != 0, ..Default::default() };
    if sel & 12 != 0 {
        let mut out = Vec::new();
        let written = if sel & 4 != 0 {
            sacct_to_generic(body, "fuzz", &SacctOptions::default(), &mut out).map(|s| s.written)
        } else {
            openb_to_generic(body, "fuzz", &mut out).map(|(n, _)| n)
        };
        let Ok(written) = written else { return };
        // Run times are the reader's to bound (--max-duration-days).
        let all = ReadOptions { max_duration_s: f64::MAX, ..Default::default() };
        let t = read_generic(&out[..], "converted", &all).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
        assert_eq!(t.jobs.len(), written);
        return;
    }
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
