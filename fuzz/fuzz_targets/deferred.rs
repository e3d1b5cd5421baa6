#![no_main]
//! A deferred stand-in's script as the agent reads it from Slurm
//! (`fleet_api::deferred::parse`): never panics on any bytes; a payload it
//! accepts embeds again (`embed`) into a script that parses back equal,
//! whatever the script and environment inside hold; and the same bytes put
//! inside the payload's script survive a round trip.
use fleet_api::deferred::{embed, parse, Payload};
use libfuzzer_sys::fuzz_target;

const HEAD: &str = "#!/bin/sh\nexec /usr/libexec/fleet/fleet-proxy --deferred\n";

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = parse(data) {
        let again = embed(HEAD, &p).expect("a parsed payload embeds");
        assert_eq!(parse(again.as_bytes()).expect("re-embedded payload parses"), p);
    }
    let p = Payload {
        fleet_job_id: "beta-00ab12cd34ef".into(),
        target: "alpha".into(),
        request: fleet_api::JobRequest { script: Some(data.to_vec()), ..Default::default() },
    };
    let s = embed(HEAD, &p).expect("embeds");
    assert_eq!(parse(s.as_bytes()).expect("parses"), p);
});
