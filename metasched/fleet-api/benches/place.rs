//! The first rule's cost per job (`placement::place`, what the submit hook
//! and the meta-scheduler run for every job that may leave), at 10, 100 and
//! 1000 clusters: without GPU quotas, with quotas that do not bind the job's
//! submitter, and with one binding it at every tenth cluster.
//! `cargo bench -p fleet-api --bench place`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use fleet_api::api::{ClusterSummary, FleetView, GpuPool, GpuQuota, NodeShape};
use fleet_api::placement::place;
use fleet_api::{GpuRequest, GpuScope, JobRequest};

fn cluster(i: usize) -> ClusterSummary {
    let ty = if i.is_multiple_of(3) { "a100" } else { "h100" };
    ClusterSummary {
        name: format!("c{i:04}"),
        healthy: true,
        scheduler: "slurm".into(),
        gpus: vec![GpuPool {
            gpu_type: ty.into(),
            total: 64,
            free: (i % 9) as u32 * 8,
            max_per_node: 8,
            nodes: 8,
            price_per_gpu_hour: Some(1.0 + (i % 7) as f64 / 4.0),
        }],
        nodes: vec![NodeShape {
            gpu_type: Some(ty.into()),
            gpus: 8,
            cpus: 64,
            memory_mb: 512_000,
            features: None,
            count: 8,
        }],
        ..Default::default()
    }
}

fn quota(users: &str) -> Option<Vec<GpuQuota>> {
    Some(vec![GpuQuota { scope: "namespace ml".into(), users: vec![users.into()], hard: 16, used: 12 }])
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("place");
    g.measurement_time(Duration::from_secs(3)).sample_size(30);
    let job = JobRequest {
        origin: "c0000".into(),
        user_name: Some("alice".into()),
        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
        ..Default::default()
    };
    for n in [10usize, 100, 1000] {
        let plain = FleetView { generated_at: 0.0, clusters: (0..n).map(cluster).collect() };
        let mut others = plain.clone();
        others.clusters.iter_mut().for_each(|c| c.gpu_quotas = quota("*:bob"));
        let mut binding = plain.clone();
        binding.clusters.iter_mut().step_by(10).for_each(|c| c.gpu_quotas = quota("*:alice"));
        for (name, view) in [("no_quotas", &plain), ("quotas_not_binding", &others), ("binding_every_10th", &binding)] {
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| b.iter(|| place(black_box(view), &job)));
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
