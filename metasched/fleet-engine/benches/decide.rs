//! Decisions per second with 10k queued jobs at 10, 100 and 1000 clusters.
//! `cargo bench -p fleet-engine --bench decide` (pin to one core with
//! `taskset -c 0` to measure one core).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fleet_engine::{decide, prepare, synth, FleetModel, Policy};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("decide");
    g.measurement_time(Duration::from_secs(5)).sample_size(20);
    for n in [10usize, 100, 1000] {
        let Ok(m) = FleetModel::build(synth::fleet_config(n, 1)) else {
            continue;
        };
        let st = synth::busy_state(&m, 1);
        let jobs: Vec<_> = synth::jobs(10_000, n, 1).iter().map(|j| prepare(&m, j)).collect();
        let policy = Policy::green();
        g.throughput(Throughput::Elements(jobs.len() as u64));
        g.bench_with_input(BenchmarkId::new("10k_jobs", n), &n, |b, _| {
            b.iter(|| {
                let mut placed = 0u32;
                for j in &jobs {
                    placed += u32::from(decide(&m, &st, black_box(j), &policy).is_some());
                }
                placed
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
