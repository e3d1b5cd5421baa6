//! The fleet-agent binary: `--check` reports without secrets, and a second
//! agent on the same fleet.conf refuses to start and leaves the first one's
//! socket alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "tok-SECRET-0123456789abcdef";

/// fleet.conf + slurm.conf in `dir`; the meta-scheduler URL points at a
/// closed loopback port.
fn site(dir: &Path, proxy_partition_line: &str) -> PathBuf {
    std::fs::write(dir.join("agent.token"), format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(dir.join("agent.token"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(
        dir.join("slurm.conf"),
        format!("ClusterName=beta\nSlurmUser=nobody\nNodeName=b1 CPUs=4\n{proxy_partition_line}\n"),
    )
    .unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let conf = dir.join("fleet.conf");
    std::fs::write(
        &conf,
        format!(
            "SiteName=beta\nMetaSchedulerUrl=http://127.0.0.1:{port}\nAgentTokenFile={d}/agent.token\n\
             AgentSocket={d}/run/agent.sock\nAgentSpoolDir={d}/spool\nProxyPartition=fleet\nSlurmBinDir=/nonexistent\nJobUserGroup=fleet-test-nogroup\n",
            d = dir.display()
        ),
    )
    .unwrap();
    conf
}

fn agent(conf: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet-agent"));
    c.arg("--conf").arg(conf).env("SLURM_CONF", conf.with_file_name("slurm.conf")).env_remove("FLEET_LOG");
    c
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn check_reports_every_check_and_no_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = site(tmp.path(), "PartitionName=fleet Nodes=b1 MaxTime=60");
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let o = agent(&conf).arg("--check").output().unwrap();
    let t = text(&o);
    assert!(!t.contains(TOKEN) && !t.contains("SECRET"), "the token leaked:\n{t}");
    for name in [
        "config",
        "fleet.conf",
        "agent user",
        "sudo rule",
        "token file",
        "proxy partition",
        "spool dir",
        "plugin socket",
        "one agent",
        "CA file",
        "meta-scheduler",
    ] {
        assert!(t.lines().any(|l| l.len() > 6 && l[6..].starts_with(name)), "no {name:?} line:\n{t}");
    }
    // The partition limit and the unreachable meta-scheduler fail, with hints.
    assert!(t.contains("FAIL  proxy partition") && t.contains("has MaxTime=60"), "{t}");
    assert!(t.contains("MaxTime=INFINITE State=UP"), "{t}");
    assert!(t.contains("FAIL  meta-scheduler") && t.contains("hint: is fleet-metasched running"), "{t}");
    assert!(t.contains("PASS  token file"), "{t}");
    assert!(t.contains("FAIL  fleet.conf") && t.contains("SlurmUser=nobody cannot reach"), "{t}");
    // SlurmUser comes from slurm.conf; the scratch directory, 0700, keeps it
    // from the socket.
    assert!(
        t.contains(&format!(
            "FAIL  plugin socket    SlurmUser=nobody cannot reach {}",
            tmp.path().join("run/agent.sock").display()
        )),
        "{t}"
    );
    assert_eq!(o.status.code(), Some(1), "a failed check exits 1:\n{t}");
    assert!(!tmp.path().join("spool").exists(), "--check creates nothing");
    // A world-readable token is a failure too.
    std::fs::set_permissions(tmp.path().join("agent.token"), std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .unwrap();
    let t = text(&agent(&conf).arg("--check").output().unwrap());
    assert!(t.contains("FAIL  token file") && t.contains("world-readable"), "{t}");
}

fn wait_for(path: &Path, child: &mut Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the first agent exited ({st}) before binding {}", path.display());
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no socket at {}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn second_agent_refuses_to_start_and_keeps_the_first_ones_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = site(tmp.path(), "PartitionName=fleet Nodes=b1 MaxTime=INFINITE");
    let sock = tmp.path().join("run/agent.sock");
    let log = tmp.path().join("first.log");
    let mut first = agent(&conf).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    wait_for(&sock, &mut first);
    // Its log is plain text off a terminal (journald, files): no ANSI colour.
    let start = Instant::now();
    let text_log = loop {
        let t = std::fs::read_to_string(&log).unwrap();
        if t.contains("fleet-agent started") || start.elapsed() > Duration::from_secs(10) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text_log.contains("fleet-agent started"), "{text_log}");
    assert!(!text_log.contains('\x1b'), "ANSI escapes in the log: {text_log:?}");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&sock).unwrap());

    let second = agent(&conf).output().unwrap();
    let t = text(&second);
    assert_eq!(second.status.code(), Some(1), "{t}");
    assert!(t.contains(&format!("fleet-agent pid {} already runs with AgentSpoolDir=", first.id())), "{t}");
    assert!(first.try_wait().unwrap().is_none(), "the first agent still runs");
    let still = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&sock).unwrap());
    assert_eq!(ino, still, "the first agent's socket was not replaced");
    std::os::unix::net::UnixStream::connect(&sock).expect("the first agent still answers on its socket");
    // --check names the running agent rather than failing.
    let t = text(&agent(&conf).arg("--check").output().unwrap());
    assert!(
        t.contains("WARN  one agent") && t.contains(&format!("a fleet-agent (pid {}) is running", first.id())),
        "{t}"
    );

    // Once the first ends (even killed), the next one starts.
    first.kill().unwrap();
    first.wait().unwrap();
    std::fs::remove_file(&sock).unwrap(); // the killed agent's leftover
    let mut third = agent(&conf).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    wait_for(&sock, &mut third);
    third.kill().unwrap();
    third.wait().unwrap();
}

/// Waits until `log` holds `want` (after `from` bytes), or panics with it.
fn wait_log(log: &Path, from: usize, want: &str, child: &mut Child) -> String {
    let start = Instant::now();
    loop {
        let t = std::fs::read_to_string(log).unwrap();
        let tail = t.get(from..).unwrap_or("").to_string();
        if tail.contains(want) {
            return tail;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the agent exited ({st}) before logging {want:?}:\n{t}");
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no {want:?} in the log:\n{t}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reloads_fleet_conf_live_settings_and_names_those_that_need_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = site(tmp.path(), "PartitionName=fleet Nodes=b1 MaxTime=INFINITE");
    let original = std::fs::read_to_string(&conf).unwrap();
    let log = tmp.path().join("agent.log");
    let mut a = agent(&conf).stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
    let pid = a.id().to_string();
    let hup = || assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_log(&log, 0, "fleet-agent started", &mut a);
    // The meta-scheduler is unreachable: the heartbeat warns once, then
    // says it again only at DEBUG, which LogLevel=info hides.
    wait_log(&log, 0, "heartbeat:", &mut a);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!std::fs::read_to_string(&log).unwrap().contains("DEBUG"), "debug lines before LogLevel=debug");

    // Live settings and one that needs a restart.
    std::fs::write(&conf, format!("{original}LogLevel=debug\nHeartbeatIntervalMs=200\nMinJobUid=5000\nRegion=mars\n"))
        .unwrap();
    let mark = std::fs::read_to_string(&log).unwrap().len();
    hup();
    let t = wait_log(&log, mark, "fleet.conf reloaded", &mut a);
    assert!(t.contains("reload: HeartbeatIntervalMs: 1s -> 200ms"), "{t}");
    assert!(t.contains("reload: LogLevel: \"info\" -> \"debug\""), "{t}");
    assert!(t.contains("MinJobUid=5000 (was JobUserMap=same JobUserGroup=fleet-test-nogroup MinJobUid=1000)"), "{t}");
    assert!(t.contains("reload: Region changed in") && t.contains("only when fleet-agent restarts"), "{t}");
    // The new level is in force: the failing heartbeat, every 200 ms, at DEBUG.
    let t = wait_log(&log, mark, "DEBUG", &mut a);
    assert!(!t.contains(TOKEN), "{t}");

    // A file that does not load changes nothing, and the agent runs on.
    std::fs::write(&conf, format!("{original}HeartbeatIntervalMs=soon\n")).unwrap();
    let mark = std::fs::read_to_string(&log).unwrap().len();
    hup();
    let t = wait_log(&log, mark, "keeping the running settings", &mut a);
    assert!(t.contains("HeartbeatIntervalMs"), "the error names the key: {t}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(a.try_wait().unwrap().is_none(), "the agent still runs");
    std::os::unix::net::UnixStream::connect(tmp.path().join("run/agent.sock")).expect("still answers");
    a.kill().unwrap();
    a.wait().unwrap();
}
