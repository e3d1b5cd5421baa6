#![no_main]
//! What the agent answers the plugin (`fleet_api::wire::PluginReply`):
//! never panics; what decodes encodes as one line that decodes back equal;
//! the stand-in tag written from a plan (`admin_tag`) gives its id back
//! (`parse_admin_tag`) whenever the id is one word.
use fleet_api::wire::{admin_tag, parse_admin_tag, PluginReply};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(reply) = serde_json::from_slice::<PluginReply>(data) else { return };
    let line = serde_json::to_string(&reply).expect("a reply encodes");
    assert!(!line.contains('\n'), "the encoded reply spans lines: {line}");
    let back: PluginReply = serde_json::from_str(&line).expect("the encoded reply decodes");
    assert_eq!(back, reply, "round trip through {line}");
    if let PluginReply::Forward(plan) = &reply {
        let tag = admin_tag(&plan.fleet_job_id, &plan.admin_comment);
        let id = &plan.fleet_job_id;
        if !id.is_empty() && !id.contains(char::is_whitespace) {
            assert_eq!(parse_admin_tag(&tag), Some(id.as_str()), "tag {tag:?}");
        }
    }
});
