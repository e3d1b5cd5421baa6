//! The submit hook's own cost, in process: `cargo bench -p job-submit-fleet
//! --bench hook` (release). The plugin is loaded as slurmctld loads it
//! (`init()` reading a fleet.conf, its view watcher reading a published
//! view) and `job_submit` runs on a realistic descriptor: sbatch's ~80
//! environment variables, a 4 KiB script, `--gres=gpu:<type>:N --hold`.
//!
//! Paths measured (p50/p99/max of each call, microseconds):
//! * `local`: `--gres=gpu:a100:1` at beta, which the view keeps home;
//! * `local, cold caches`: the same with every cache level flushed
//!   before each call (slurmctld's case: one submission every few ms);
//! * `local, whole request`: what the LOCAL path cost before it stopped
//!   copying the request (`build_request` alone, no decision);
//! * `deferred`: `--gres=gpu:h100:8` (beta has none) with
//!   `ForwardMode=deferred` (the default): the stand-in carries the
//!   request (and one wake-up datagram is sent, to no agent here);
//! * `forward (sync)`: the same job with `ForwardMode=sync`, asking an agent that answers FORWARD at
//!   once (the hook's side of the round trip: JSON, socket, rewrite; a real
//!   agent adds its decision and its journal write).
//!
//! Every call's outcome is checked (partition unchanged or the proxy's), so
//! a path that silently changed makes the benchmark fail rather than
//! report a faster wrong answer. `BENCH_ITERS` sets the LOCAL count (20000);
//! `BENCH_COLD_ONLY=N` stops after N cold calls (for a cache simulator).

use std::ffi::{c_char, CString};
use std::io::{BufRead, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_api::wire::{ForwardPlan, PluginReply};
use job_submit_fleet::{build_request, FleetSubmit, PluginConfig, Prepared};
use slurm::job_desc::{free_test_descriptor, JobDesc, NumField, StrField};
use slurm::job_submit::JobSubmitPlugin;

const VIEW: &str = r#"{"generated_at":0,"clusters":[
 {"name":"alpha","region":"lab-east","provider":"onprem","scheduler":"slurm","healthy":true,"heartbeat_age_s":0.9,
  "gpus":[{"gpu_type":"h100","total":16,"free":16,"max_per_node":8,"nodes":2,"price_per_gpu_hour":1.49}],
  "queue_pending":0,"queue_running":0,
  "nodes":[{"gpu_type":"h100","gpus":8,"cpus":32,"memory_mb":64000,"features":[],"count":2}],
  "identities":{"mapping":"JobUserMap=same","users":["*:alice","*:bob","*:dora"]},"health":"healthy"},
 {"name":"beta","region":"lab-west","provider":"onprem","scheduler":"slurm","healthy":true,"heartbeat_age_s":0.0,
  "gpus":[{"gpu_type":"a100","total":16,"free":16,"max_per_node":8,"nodes":2,"price_per_gpu_hour":0.9}],
  "queue_pending":0,"queue_running":0,
  "nodes":[{"gpu_type":"a100","gpus":8,"cpus":32,"memory_mb":64000,"features":[],"count":2}],
  "identities":{"mapping":"JobUserMap=same","users":["*:alice","*:bob","*:dora"]},"health":"healthy"},
 {"name":"delta","region":"lab-central","provider":"onprem","scheduler":"slurm","healthy":true,"heartbeat_age_s":0.9,
  "gpus":[{"gpu_type":"h100","total":16,"free":16,"max_per_node":8,"nodes":2,"price_per_gpu_hour":1.6}],
  "queue_pending":0,"queue_running":0,
  "nodes":[{"gpu_type":"h100","gpus":8,"cpus":32,"memory_mb":64000,"features":[],"count":2}],
  "identities":{"mapping":"JobUserMap=same","users":["*:alice","*:bob","*:dora"]},"health":"healthy"}]}"#;

/// sbatch's environment for a login shell: 80 entries.
fn environment() -> Vec<CString> {
    let mut env: Vec<String> = [
        "SHELL=/bin/bash",
        "HOME=/home/alice",
        "USER=alice",
        "LOGNAME=alice",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cuda/bin",
        "LANG=C.UTF-8",
        "TERM=xterm-256color",
        "PWD=/tmp",
        "SLURM_CONF=/etc/slurm/slurm.conf",
        "LD_LIBRARY_PATH=/opt/cuda/lib64:/usr/local/lib",
        "SLURM_EXPORT_ENV=ALL",
        "SLURM_GET_USER_ENV=0",
    ]
    .map(String::from)
    .to_vec();
    for i in env.len()..80 {
        env.push(format!("MODULE_VAR_{i}=/opt/modules/{i}/share/lib/python3.11/site-packages:/opt/modules/{i}/bin"));
    }
    env.into_iter().map(|e| CString::new(e).unwrap()).collect()
}

/// A 4 KiB batch script.
fn script() -> String {
    let mut s = String::from("#!/bin/bash\n#SBATCH --job-name=train\n");
    while s.len() < 4096 {
        s.push_str("srun python train.py --epochs 10 --batch-size 256 --lr 0.001 --data /scratch/data\n");
    }
    s
}

/// A descriptor as slurmctld hands it over for `sbatch --hold <gres> job.sh`.
struct Desc {
    raw: Box<slurm::sys::job_desc_msg_t>,
    _env: Vec<CString>,
    _ptrs: Vec<*mut c_char>,
}

impl Desc {
    fn new(gres: &str, script: &str, env: &[CString]) -> Desc {
        let env = env.to_vec();
        let mut ptrs: Vec<*mut c_char> = env.iter().map(|c| c.as_ptr() as *mut c_char).collect();
        let mut raw = JobDesc::test_descriptor();
        raw.environment = ptrs.as_mut_ptr();
        raw.env_size = ptrs.len() as u32;
        {
            let mut jd = JobDesc::from_box(&mut raw);
            jd.set(StrField::Script, Some(script));
            jd.set(StrField::TresPerNode, Some(gres));
            jd.set(StrField::Name, Some("fleet-bench"));
            jd.set(StrField::WorkDir, Some("/tmp"));
            jd.set(StrField::StdOut, Some("/dev/null"));
            jd.set(StrField::Partition, Some("gpu"));
            jd.set(StrField::SubmitLine, Some("sbatch --parsable --hold -J fleet-bench -o /dev/null job.sh"));
            jd.set_num(NumField::UserId, slurm::process_uid().into());
            jd.set_num(NumField::GroupId, 1001);
            jd.set_num(NumField::Priority, 0);
        }
        Desc { raw, _env: env, _ptrs: ptrs }
    }

    fn job(&mut self) -> JobDesc<'_> {
        JobDesc::from_box(&mut self.raw)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        self.raw.environment = std::ptr::null_mut();
        self.raw.env_size = 0;
        let raw = std::mem::replace(&mut self.raw, JobDesc::test_descriptor());
        free_test_descriptor(raw);
    }
}

fn conf(dir: &Path, name: &str, extra: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "SiteName=beta\nMetaSchedulerUrl=https://127.0.0.1:16900\nAgentSocket={}\nAgentTokenFile={}\n\
             AgentSpoolDir={}\nProxyPartition=fleet\nProxyPath=/usr/libexec/fleet/fleet-proxy\nSubmitTimeoutMs=50\n\
             ViewMaxAgeMs=3600000\n{extra}",
            dir.join("agent.sock").display(),
            dir.join("token").display(),
            dir.join("agent").display()
        ),
    )
    .unwrap();
    p
}

fn load(path: &Path) -> FleetSubmit {
    std::env::set_var("FLEET_CONF", path);
    FleetSubmit::init().expect("the plugin loads")
}

fn report(what: &str, mut ns: Vec<u64>) {
    ns.sort_unstable();
    let pct = |p: f64| ns[((ns.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    println!(
        "hook {what:<28} n={:<6} p50_us={:<8.1} p99_us={:<8.1} max_us={:.1}",
        ns.len(),
        pct(0.50),
        pct(0.99),
        *ns.last().unwrap() as f64 / 1000.0
    );
}

/// An agent that answers every request FORWARD at once.
fn fake_agent(path: &Path) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut n = 0u64;
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut line = String::new();
            let _ = std::io::BufReader::new(&s).read_line(&mut line);
            n += 1;
            let plan = ForwardPlan {
                fleet_job_id: format!("beta-{n:012x}"),
                target: "alpha".into(),
                proxy_partition: "fleet".into(),
                proxy_script: "#!/bin/sh\nexec /usr/libexec/fleet/fleet-proxy --job beta-0\n".into(),
                admin_comment: "forwarded beta -> alpha: gpu:h100:8 on 1 node(s)".into(),
                comment: "fleet: alpha (waiting)".into(),
                proxy_mail: 0,
            };
            let mut reply = serde_json::to_vec(&PluginReply::Forward(Box::new(plan))).unwrap();
            reply.push(b'\n');
            let _ = s.write_all(&reply);
        }
    });
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("agent")).unwrap();
    // Every cluster maps the user running the benchmark (root, too).
    let me = slurm::user_name_of(slurm::process_uid()).expect("the benchmark's user has a name");
    std::fs::write(dir.path().join("agent/view.json"), VIEW.replace("\"*:dora\"", &format!("\"*:dora\",\"*:{me}\"")))
        .unwrap();
    let env = environment();
    let script = script();
    println!(
        "descriptor: {} environment entries ({} bytes), script {} bytes",
        env.len(),
        env.iter().map(|e| e.as_bytes().len()).sum::<usize>(),
        script.len()
    );

    // LOCAL: one descriptor, never rewritten.
    let local = load(&conf(dir.path(), "sync.conf", ""));
    let mut d = Desc::new("gres:gpu:a100:1", &script, &env);
    let mut ns = Vec::with_capacity(iters);
    for i in 0..iters + 1000 {
        let mut jd = d.job();
        let t = Instant::now();
        let r = local.submit(&mut jd, slurm::process_uid());
        let el = t.elapsed().as_nanos() as u64;
        assert_eq!(r, Ok(()));
        if i >= 1000 {
            ns.push(el);
        }
    }
    assert_eq!(d.job().get(StrField::Partition).as_deref(), Some("gpu"), "LOCAL leaves the job as submitted");
    report("local", ns);

    // The same, with the caches cold before each call, as in slurmctld,
    // whose RPC thread runs the hook between other work about every
    // 10 ms: 64 MiB written between calls evicts the plugin's code and
    // data from every cache level (and its pages from the TLB).
    let cold_iters = std::env::var("BENCH_COLD_ONLY").ok().and_then(|v| v.parse().ok());
    let mut junk = vec![0u8; 64 << 20];
    let mut ns = Vec::with_capacity(iters / 10);
    for i in 0..cold_iters.unwrap_or(iters / 10) {
        for b in junk.iter_mut().step_by(64) {
            *b = b.wrapping_add(i as u8);
        }
        let mut jd = d.job();
        let t = Instant::now();
        let r = local.submit(&mut jd, slurm::process_uid());
        let el = t.elapsed().as_nanos() as u64;
        assert_eq!(r, Ok(()));
        ns.push(el);
    }
    std::hint::black_box(&junk);
    drop(junk);
    report("local, cold caches", ns);
    if cold_iters.is_some() {
        // Only the cold case (for a cache simulator: `valgrind --tool=callgrind --cache-sim=yes`).
        return local.fini();
    }

    // The whole request, as the LOCAL path read it before.
    let cfg = PluginConfig::load_from(&dir.path().join("sync.conf")).unwrap().0;
    let mut ns = Vec::with_capacity(iters);
    for _ in 0..iters {
        let mut jd = d.job();
        let t = Instant::now();
        let r = build_request(&mut jd, &cfg, slurm::process_uid());
        let el = t.elapsed().as_nanos() as u64;
        assert!(matches!(&r, Ok(Prepared::Ask(req)) if req.env.len() == 80 && req.script.is_some()));
        drop(r);
        ns.push(el);
    }
    report("local, whole request (old)", ns);
    drop(d);
    local.fini();

    // FORWARD: a fresh descriptor per call (the hook rewrites it).
    let forward = |plugin: &FleetSubmit, n: usize, what: &str| {
        let mut ns = Vec::with_capacity(n);
        for i in 0..n + 200 {
            let mut d = Desc::new("gres:gpu:h100:8", &script, &env);
            let mut jd = d.job();
            let t = Instant::now();
            let r = plugin.submit(&mut jd, slurm::process_uid());
            let el = t.elapsed().as_nanos() as u64;
            assert_eq!(r, Ok(()));
            assert_eq!(jd.get(StrField::Partition).as_deref(), Some("fleet"), "{what}: the job became a stand-in");
            if i >= 200 {
                ns.push(el);
            }
        }
        report(what, ns);
    };
    // The deferred path in parts: the whole request, the stand-in, the rewrite.
    let (mut read, mut plan, mut write) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iters / 4 {
        let mut d = Desc::new("gres:gpu:h100:8", &script, &env);
        let mut jd = d.job();
        let t = Instant::now();
        let Ok(Prepared::Ask(req)) = build_request(&mut jd, &cfg, slurm::process_uid()) else {
            panic!("an H100 job is read")
        };
        let t1 = Instant::now();
        let p = job_submit_fleet::deferred_plan(&cfg, &req, "alpha", "bench").unwrap();
        let t2 = Instant::now();
        job_submit_fleet::rewrite(&mut jd, &p, job_submit_fleet::StandInTime::Proxy);
        let t3 = Instant::now();
        read.push((t1 - t).as_nanos() as u64);
        plan.push((t2 - t1).as_nanos() as u64);
        write.push((t3 - t2).as_nanos() as u64);
    }
    report("deferred: whole request", read);
    report("deferred: deferred_plan", plan);
    report("deferred: rewrite", write);

    let deferred = load(&conf(dir.path(), "deferred.conf", "ForwardMode=deferred\n"));
    forward(&deferred, iters / 4, "deferred");
    deferred.fini();

    fake_agent(&dir.path().join("agent.sock"));
    std::thread::sleep(Duration::from_millis(50));
    let sync = load(&conf(dir.path(), "sync.conf", "ForwardMode=sync\n"));
    forward(&sync, iters / 4, "forward (sync, instant agent)");
    sync.fini();
}
