#![no_main]
//! What the plugin sends the agent (`fleet_api::wire::PluginRequest`, one
//! JSON line, read with `serde_json::from_slice` as the agent does):
//! never panics; what decodes, the plugin's encoder writes as one line
//! (no raw newline, the agent reads to the first) that decodes back equal,
//! and the request's derived views (GPU total, export mode, GPU type,
//! the stand-in tag's parser) do not panic on it.
use fleet_api::wire::{parse_admin_tag, PluginRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<PluginRequest>(data) else { return };
    let line = serde_json::to_string(&req).expect("a request encodes");
    assert!(!line.contains('\n'), "the encoded request spans lines: {line}");
    let back: PluginRequest = serde_json::from_str(&line).expect("the encoded request decodes");
    assert_eq!(back, req, "round trip through {line}");
    if let PluginRequest::Submit { job, .. } = &req {
        let _ = (job.total_gpus(), job.export_mode(), job.gpu_type(), job.gpus_per_node());
        if let Some(c) = &job.comment {
            if let Some(id) = parse_admin_tag(c) {
                assert!(!id.is_empty() && !id.contains(char::is_whitespace));
            }
        }
    }
});
