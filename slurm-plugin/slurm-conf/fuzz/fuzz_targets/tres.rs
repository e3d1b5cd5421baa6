#![no_main]
//! TRES parsing never panics; requests it returns ask for ≥ 1 GPU.
use fleet_api::GpuScope;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    match slurm_conf::tres::parse_tres(s, GpuScope::Node) {
        Ok(reqs) => assert!(reqs.iter().all(|r| r.count >= 1)),
        Err(e) => assert!(e.to_string().starts_with("bad GPU request \"")),
    }
});
