#![no_main]
//! The `--fleet*` options as `job_submit_fleet.so` reads them back from a
//! job's SPANK environment (`fleet_api::options::from_spank_env`, one
//! `NAME=value` entry per line of the input): never panics; an error names
//! the option; what parses holds only valid cluster names and URIs, and
//! written back as SPANK entries parses to the same options.
use fleet_api::options::{from_spank_env, SPANK_ENV_PREFIX};
use fleet_api::{FleetMode, FleetOptions};
use libfuzzer_sys::fuzz_target;

fn entries(o: &FleetOptions) -> Vec<String> {
    let e = |k: &str, v: &str| format!("{SPANK_ENV_PREFIX}{k}={v}");
    let mut out = vec![e(
        "fleet",
        match o.mode {
            FleetMode::Auto => "auto",
            FleetMode::Local => "local",
            FleetMode::Remote => "remote",
        },
    )];
    if !o.to.is_empty() {
        out.push(e("fleet_to", &o.to.join(",")));
    }
    if let Some(p) = o.max_price {
        out.push(e("fleet_max_price", &p.to_string()));
    }
    if !o.data.is_empty() {
        out.push(e("fleet_data", &o.data.join(",")));
    }
    if let Some(c) = &o.ckpt {
        out.push(e("fleet_ckpt", c));
    }
    out.push(e("fleet_interruptible", if o.interruptible { "(null)" } else { "no" }));
    if let Some(i) = &o.image {
        out.push(e("fleet_image", i));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let env: Vec<&str> = text.split(['\n', '\0']).collect();
    let opts = match from_spank_env(env.iter().copied()) {
        Ok(o) => o,
        Err(e) => {
            assert!(e.starts_with("--fleet") || e.starts_with("unknown Fleet option --"), "{e}");
            return;
        }
    };
    for c in &opts.to {
        assert!(!c.is_empty() && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{c:?}");
    }
    for u in opts.data.iter().chain(&opts.ckpt) {
        assert!(!u.is_empty() && !u.contains(|c: char| c.is_whitespace() || c.is_control()), "{u:?}");
    }
    assert!(opts.max_price.is_none_or(|p| p.is_finite() && p > 0.0));
    if let Some(i) = &opts.image {
        assert!(fleet_api::options::check_image(i).is_ok() && !i.starts_with('-'), "{i:?}");
    }
    let again = entries(&opts);
    let back = from_spank_env(again.iter().map(String::as_str)).expect("written-back options parse");
    assert_eq!(back, opts, "via {again:?}");
});
