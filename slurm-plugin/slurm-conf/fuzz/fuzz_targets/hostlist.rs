#![no_main]
//! expand never panics and respects its cap; what it expands,
//! compress/expand gives back (as a set, without duplicates).
use libfuzzer_sys::fuzz_target;
use slurm_conf::hostlist;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(names) = hostlist::expand_capped(s, 10_000) else { return };
    assert!(names.len() <= 10_000);
    let expr = hostlist::compress(&names);
    let back = hostlist::expand_capped(&expr, 10_000).expect("compress output expands");
    let mut want = names.clone();
    want.sort();
    want.dedup();
    let mut got = back.clone();
    got.sort();
    assert_eq!(got.len(), back.len(), "compress produced duplicates for {expr:?}");
    got.dedup();
    assert_eq!(got, want, "round trip of {s:?} via {expr:?}");
});
