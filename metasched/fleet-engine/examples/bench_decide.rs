//! Quick decisions/s and memory figures without criterion:
//! `cargo run --release -p fleet-engine --example bench_decide`
//! (prefix `taskset -c 0` for one core).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use fleet_engine::{decide, prepare, synth, FleetModel, Policy};

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Nanoseconds this thread has spent on a CPU (Linux), if readable:
/// the machine may be shared, so decisions/s is per CPU-second.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn main() {
    let njobs: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>14} {:>12} {:>12} {:>14}",
        "clusters", "jobs", "model_KiB", "state_KiB", "jobs_KiB", "dec/cpu-s", "dec/wall-s", "heap growth"
    );
    let sizes: Vec<usize> = match std::env::args().nth(2) {
        Some(s) => s.split(',').filter_map(|x| x.parse().ok()).collect(),
        None => vec![10, 100, 1000],
    };
    for n in sizes {
        let b0 = live();
        let Ok(m) = FleetModel::build(synth::fleet_config(n, 1)) else {
            continue;
        };
        let b1 = live();
        let st = synth::busy_state(&m, 1);
        let b2 = live();
        let specs = synth::jobs(njobs, n, 1);
        let jobs: Vec<_> = specs.iter().map(|j| prepare(&m, j)).collect();
        let b3 = live();
        let policy = Policy::green();
        let mut placed = 0usize;
        let target = std::time::Duration::from_secs(2);
        let t = Instant::now();
        let c0 = cpu_ns();
        let mut decisions = 0usize;
        let before = live();
        while t.elapsed() < target {
            for j in &jobs {
                placed += usize::from(decide(&m, &st, j, &policy).is_some());
            }
            decisions += jobs.len();
        }
        let wall = t.elapsed().as_secs_f64();
        let secs = match (c0, cpu_ns()) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
            _ => wall,
        };
        let grew = live().saturating_sub(before);
        println!(
            "{:>8} {:>8} {:>12} {:>12} {:>14} {:>12.0} {:>12.0} {:>14}",
            n,
            njobs,
            (b1 - b0) / 1024,
            (b2 - b1) / 1024,
            (b3 - b2) / 1024,
            decisions as f64 / secs,
            decisions as f64 / wall,
            if grew == 0 { "0 bytes".to_string() } else { format!("{grew} bytes") }
        );
        std::hint::black_box(placed);
        drop((m, st, jobs, specs));
    }
}
