#![no_main]
//! The meta-scheduler's HTTP request bodies, decoded as its handlers do
//! (`serde_json::from_slice` of the fleet-api type; the first input byte
//! picks the route): never panics; what decodes encodes and decodes back
//! equal; a heartbeat goes through what the store computes from it
//! before any SQL (`inventory_violation`, `node_shapes`, `gpu_pools`),
//! whose pools never hold more free GPUs than GPUs.
use fleet_api::api::{
    ForwardRequest, Heartbeat, OutputChunk, SignalRequest, StartConfirmation, StartRequest, StatusUpdate,
};
use fleet_metasched::config::ClusterConfig;
use fleet_metasched::store::{gpu_pools, inventory_violation, node_shapes};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn round_trip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(body: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(body).ok()?;
    let text = serde_json::to_string(&v).expect("a body encodes");
    let back: T = serde_json::from_str(&text).expect("an encoded body decodes");
    assert_eq!(back, v, "round trip through {text}");
    Some(v)
}

fuzz_target!(|data: &[u8]| {
    let Some((&route, body)) = data.split_first() else { return };
    match route % 7 {
        0 => {
            let Some(hb) = round_trip::<Heartbeat>(body) else { return };
            let cfg = ClusterConfig {
                name: hb.cluster.clone(),
                max_nodes: Some(64),
                max_gpus: Some([("h100".to_string(), 512), ("a100".to_string(), 512)].into()),
                ..Default::default()
            };
            let _ = inventory_violation(&cfg, &hb);
            let _ = node_shapes(&hb.nodes);
            for p in gpu_pools(&hb.nodes) {
                assert!(p.free <= p.total && p.max_per_node <= p.total, "{p:?}");
            }
        }
        1 => {
            round_trip::<ForwardRequest>(body);
        }
        2 => {
            round_trip::<StatusUpdate>(body);
        }
        3 => {
            round_trip::<OutputChunk>(body);
        }
        4 => {
            round_trip::<StartRequest>(body);
        }
        5 => {
            round_trip::<StartConfirmation>(body);
        }
        _ => {
            if let Some(s) = round_trip::<SignalRequest>(body) {
                let _ = fleet_api::api::check_signal_name(&s.signal);
            }
        }
    }
});
