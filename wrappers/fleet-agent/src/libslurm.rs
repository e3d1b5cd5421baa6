//! One job's record straight from slurmctld through libslurm's own API
//! (`slurm_load_job`): the fast, structured read of the start check.
//!
//! Why: Slurm 22.05's `squeue --json` ignores `-j` and prints every job
//! slurmctld holds (6.7 MB for 2,100 jobs, 0.3 s of CPU and 1–2 s of wall
//! time on a busy controller host), and the origin agent needs one
//! stand-in's state between the stand-in's start and the job's start at
//! the target — latency a researcher pays on every forwarded job. One
//! `slurm_load_job` RPC is a few milliseconds and, like the JSON, never
//! parses text a user can influence: the fields are read from Slurm's own
//! structures.
//!
//! How: the library is `dlopen`ed at run time (an agent for a Kubernetes
//! cluster has no libslurm, and a binary linked against one soname would
//! not start beside another release), and used only when its
//! `slurm_api_version()` is the API generation of the release whose
//! headers the agent was built against — `slurm_job_info_t`'s layout
//! (from bindgen, crate `slurm-sys`) changes in every release. Anything else (no
//! library, another release, a failed call) answers `None`, and the
//! caller takes the JSON path. Calls are serialised (libslurm keeps
//! global state) and run on a blocking thread.

use std::ffi::{c_char, c_int, c_long, CStr, CString};
use std::sync::OnceLock;

use parking_lot::Mutex;
use slurm_sys as sys;

use crate::backend::NativeJob;

type LoadJob = unsafe extern "C" fn(*mut *mut sys::job_info_msg_t, u32, u16) -> c_int;
type LoadJobs = unsafe extern "C" fn(libc::time_t, *mut *mut sys::job_info_msg_t, u16) -> c_int;
type BatchScript = unsafe extern "C" fn(*mut libc::FILE, u32) -> c_int;
type FreeJobInfo = unsafe extern "C" fn(*mut sys::job_info_msg_t);
type Init = unsafe extern "C" fn(*const c_char);
type ApiVersion = unsafe extern "C" fn() -> c_long;

struct Lib {
    load_job: LoadJob,
    /// `slurm_load_jobs` and `slurm_job_batch_script` (in every release
    /// since 20.11; optional all the same: without them the pickup of
    /// deferred stand-ins uses the commands).
    load_jobs: Option<LoadJobs>,
    batch_script: Option<BatchScript>,
    free: FreeJobInfo,
    /// Which library and release, for `--check` and the log.
    what: String,
}

/// The library, once per process: `None` when there is none of this
/// release (the reason is in [`status`]).
static LIB: OnceLock<Result<Mutex<Lib>, String>> = OnceLock::new();

/// `major.minor` of a `SLURM_VERSION_NUMBER` (`0xMMmmuu`).
fn release(v: u64) -> (u64, u64) {
    ((v >> 16) & 0xff, (v >> 8) & 0xff)
}

/// The libslurm API generation (`slurm_api_version() >> 16`, the soname's
/// number: `libslurm.so.38`) of each Slurm release whose layout the agent
/// may be built against; another release leaves the fast path off.
fn api_of(release: (u64, u64)) -> Option<u64> {
    Some(match release {
        (22, 5) => 38,
        (23, 2) => 39,
        (23, 11) => 40,
        (24, 5) => 41,
        (24, 11) => 42,
        (25, 5) => 43,
        _ => return None,
    })
}

/// Where libslurm may be: the development symlink, then any versioned
/// soname in the usual library directories.
fn candidates() -> Vec<String> {
    let mut out = vec!["libslurm.so".to_string()];
    for dir in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"] {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("libslurm.so."))
            .collect();
        names.sort();
        out.extend(names.into_iter().map(|n| format!("{dir}/{n}")));
    }
    out
}

/// # Safety
/// `handle` is a live `dlopen` handle.
unsafe fn sym(handle: *mut libc::c_void, name: &str) -> Option<*mut libc::c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: handle is live (caller) and c is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn open(slurm_conf: &std::path::Path) -> Result<Lib, String> {
    // libslurm's slurm_init() exits the process (fatal()) on a
    // configuration it cannot read: make sure it can, first.
    if let Err(e) = std::fs::File::open(slurm_conf) {
        return Err(format!("{}: {e}", slurm_conf.display()));
    }
    let built = u64::from(sys::SLURM_VERSION_NUMBER);
    let mut tried = Vec::new();
    for path in candidates() {
        let Ok(c) = CString::new(path.clone()) else { continue };
        // RTLD_GLOBAL: the plugins libslurm loads itself (auth/munge,
        // hash/k12) resolve libslurm's symbols through the global scope.
        // SAFETY: c is NUL-terminated; dlopen has no other precondition.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            continue;
        }
        // SAFETY: handle was just opened and is never closed (the library
        // stays for the process's life, as the function pointers do).
        let found = unsafe {
            (
                sym(handle, "slurm_api_version"),
                sym(handle, "slurm_init"),
                sym(handle, "slurm_load_job"),
                sym(handle, "slurm_free_job_info_msg"),
            )
        };
        // SAFETY: as above.
        let (jobs, script) = unsafe { (sym(handle, "slurm_load_jobs"), sym(handle, "slurm_job_batch_script")) };
        // SAFETY: the C signatures of slurm.h (20.11 to 25.05).
        let (load_jobs, batch_script) = unsafe {
            (
                jobs.map(|p| std::mem::transmute::<*mut libc::c_void, LoadJobs>(p)),
                script.map(|p| std::mem::transmute::<*mut libc::c_void, BatchScript>(p)),
            )
        };
        let (Some(ver), Some(init), Some(load), Some(free)) = found else {
            tried.push(format!("{path}: lacks the job API"));
            continue;
        };
        // SAFETY: the symbols have these C signatures in every release
        // since 20.11 (slurm.h); a pointer from dlsym converts to an
        // `extern "C" fn` of the symbol's type.
        let (ver, init, load, free) = unsafe {
            (
                std::mem::transmute::<*mut libc::c_void, ApiVersion>(ver),
                std::mem::transmute::<*mut libc::c_void, Init>(init),
                std::mem::transmute::<*mut libc::c_void, LoadJob>(load),
                std::mem::transmute::<*mut libc::c_void, FreeJobInfo>(free),
            )
        };
        // SAFETY: takes no arguments, reads a constant.
        let runtime = (unsafe { ver() } as u64 >> 16) & 0xff;
        let (ma, mi) = release(built);
        let Some(want) = api_of((ma, mi)) else {
            return Err(format!(
                "the agent was built for Slurm {ma}.{mi}, whose libslurm API fleet-agent does not know"
            ));
        };
        if runtime != want {
            tried.push(format!("{path}: API {runtime}, the agent was built for Slurm {ma}.{mi} (API {want})"));
            continue;
        }
        let conf = CString::new(slurm_conf.as_os_str().as_encoded_bytes()).map_err(|_| "slurm.conf path holds NUL")?;
        // SAFETY: conf is NUL-terminated and outlives the call (libslurm
        // copies what it keeps); called once per process, before any
        // other call into the library.
        unsafe { init(conf.as_ptr()) };
        return Ok(Lib {
            load_job: load,
            load_jobs,
            batch_script,
            free,
            what: format!("{path} (Slurm {ma}.{mi}, API {runtime})"),
        });
    }
    Err(if tried.is_empty() { "no libslurm found".to_string() } else { tried.join("; ") })
}

/// The library once [`enable`]d (or [`open_here`]ed); `None` before.
fn lib() -> Option<&'static Mutex<Lib>> {
    LIB.get()?.as_ref().ok()
}

/// Opens and initialises the library in this process, whatever happens:
/// libslurm `fatal()`s (exits the process) on a slurm.conf it cannot
/// use, so only a throw-away process calls this first (`fleet-agent
/// --load-job`, the probe of [`enable`]).
pub fn open_here(slurm_conf: &std::path::Path) -> Result<String, String> {
    match LIB.get_or_init(|| open(slurm_conf).map(Mutex::new)) {
        Ok(l) => Ok(l.lock().what.clone()),
        Err(e) => Err(e.clone()),
    }
}

/// The exit code of a probe (`fleet-agent --probe-libslurm`) that opened
/// and initialised the library (libslurm's own `fatal()` exits 1).
pub const PROBE_OK: u8 = 42;

/// Turns the fast path on for this process when a probe — `exe
/// --probe-libslurm SLURM_CONF`, a child that opens and initialises
/// libslurm the same way — survived: which library is used, or why the
/// path is off. Blocking (run it on a blocking thread).
pub fn enable(exe: &std::path::Path, slurm_conf: &std::path::Path) -> Result<String, String> {
    if let Some(done) = LIB.get() {
        return done.as_ref().map(|l| l.lock().what.clone()).map_err(Clone::clone);
    }
    let probe = std::process::Command::new(exe)
        .arg("--probe-libslurm")
        .arg(slurm_conf)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("probing libslurm with {}: {e}", exe.display()))?;
    let said = String::from_utf8_lossy(&probe.stderr);
    match probe.status.code() {
        Some(c) if c == i32::from(PROBE_OK) => open_here(slurm_conf),
        Some(3) => Err(said.trim().to_string()),
        _ => Err(format!(
            "libslurm did not survive a probe ({}): {}",
            probe.status,
            said.trim().lines().last().unwrap_or("")
        )),
    }
}

/// Bits of `job_state` above [`sys::JOB_STATE_BASE`] that Slurm names
/// instead of the base state (slurm.h's `JOB_*` flags; the same bits in
/// every supported release), in the order Slurm's own
/// `job_state_string` tests them.
const FLAG_NAMES: [(u32, &str); 12] = [
    (1 << 16, "STOPPED"),
    (1 << 8, "LAUNCH_FAILED"),
    (1 << 10, "REQUEUED"),
    (1 << 20, "REQUEUE_FED"),
    (1 << 11, "REQUEUE_HOLD"),
    (1 << 12, "SPECIAL_EXIT"),
    (1 << 23, "STAGE_OUT"),
    (1 << 13, "RESIZING"),
    (1 << 19, "REVOKED"),
    (1 << 22, "SIGNALING"),
    (1 << 14, "CONFIGURING"),
    (1 << 15, "COMPLETING"),
];

/// Slurm's name of `job_state` (base state, or the flag Slurm shows).
pub fn state_name(job_state: u32) -> &'static str {
    if let Some((_, n)) = FLAG_NAMES.iter().find(|(bit, _)| job_state & bit != 0) {
        return n;
    }
    match job_state & sys::JOB_STATE_BASE {
        0 => "PENDING",
        1 => "RUNNING",
        2 => "SUSPENDED",
        3 => "COMPLETED",
        4 => "CANCELLED",
        5 => "FAILED",
        6 => "TIMEOUT",
        7 => "NODE_FAIL",
        8 => "PREEMPTED",
        9 => "BOOT_FAIL",
        10 => "DEADLINE",
        11 => "OUT_OF_MEMORY",
        _ => "UNKNOWN",
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated (caller).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What the start check reads of one record.
fn native_from(j: &sys::slurm_job_info_t) -> NativeJob {
    let mut n = NativeJob::new(u64::from(j.job_id), state_name(j.job_state));
    // SAFETY: libslurm fills these as NUL-terminated strings or null.
    let (partition, admin_comment) = unsafe { (text(j.partition), text(j.admin_comment)) };
    n.partition = partition;
    n.admin_comment = admin_comment;
    n.restarts = u32::from(j.restart_cnt);
    n.user_id = Some(j.user_id);
    n.submit_time = Some(j.submit_time);
    // INFINITE and NO_VAL are u32::MAX and u32::MAX - 1 (as the JSON path).
    n.time_limit_min = (1..u32::MAX - 1).contains(&j.time_limit).then_some(j.time_limit);
    // A wait(2) status, as Slurm keeps it.
    let status = j.exit_code;
    n.exit_code = (status & 0x7f == 0).then_some(((status >> 8) & 0xff) as i32);
    n.signal = (status & 0x7f != 0).then_some((status & 0x7f) as i32);
    if j.array_job_id != 0 {
        n.array_job_id = Some(u64::from(j.array_job_id));
        n.array_task_id = Some(j.array_task_id);
    }
    n
}

/// Job `id` as slurmctld holds it: `None` when the fast path is off (not
/// [`enable`]d) or the call failed, a job slurmctld does not know
/// included (the caller then asks `squeue --json`, which decides).
pub fn load_job(id: u64) -> Option<NativeJob> {
    let lib = lib()?;
    let id = u32::try_from(id).ok()?;
    let l = lib.lock();
    let mut msg: *mut sys::job_info_msg_t = std::ptr::null_mut();
    // SAFETY: msg is a valid out-pointer; SHOW_ALL includes hidden
    // partitions (the proxy partition may be hidden).
    let rc = unsafe { (l.load_job)(&mut msg, id, sys::FLEET_SHOW_ALL) };
    // SAFETY: msg is what slurm_load_job set, on success or not.
    unsafe { read_and_free(&l, rc, msg, |recs| recs.iter().find(|j| j.job_id == id).map(native_from)) }.flatten()
}

/// `read(records)` of the job-info message `msg` that a load call
/// answered with `rc`, then the message freed; `None` when the call
/// failed.
///
/// # Safety
/// `msg` is null or a message from `slurm_load_job(s)` not yet freed.
unsafe fn read_and_free<T>(
    l: &Lib,
    rc: c_int,
    msg: *mut sys::job_info_msg_t,
    read: impl FnOnce(&[sys::slurm_job_info_t]) -> T,
) -> Option<T> {
    if rc != 0 || msg.is_null() {
        return None;
    }
    // SAFETY: on success msg points to a message of record_count records
    // in job_array, valid until freed below.
    let out = unsafe {
        let m = &*msg;
        let recs: &[sys::slurm_job_info_t] = if m.job_array.is_null() || m.record_count == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(m.job_array, m.record_count as usize)
        };
        read(recs)
    };
    // SAFETY: msg came from the library and is freed once.
    unsafe { (l.free)(msg) };
    Some(out)
}

/// Every job slurmctld holds (hidden partitions included), with what
/// [`load_job`] reads of each: one `slurm_load_jobs` RPC instead of a
/// `squeue --json` process and its JSON (the deferred pickup's scan).
/// `None` when the fast path is off or the call failed.
pub fn load_jobs() -> Option<Vec<NativeJob>> {
    let lib = lib()?;
    let l = lib.lock();
    let load = l.load_jobs?;
    let mut msg: *mut sys::job_info_msg_t = std::ptr::null_mut();
    // SAFETY: msg is a valid out-pointer; update_time 0 asks for every
    // record; SHOW_ALL includes hidden partitions.
    let rc = unsafe { load(0, &mut msg, sys::FLEET_SHOW_ALL) };
    // SAFETY: msg is what slurm_load_jobs set, on success or not.
    unsafe { read_and_free(&l, rc, msg, |recs| recs.iter().map(native_from).collect()) }
}

/// The batch script slurmctld stores for job `id`, read as the agent
/// (`slurm_job_batch_script`: slurmctld lets root, SlurmUser, operators
/// and the job's owner read it). `None` when the fast path is off, the
/// call failed (not allowed, no such job) or printed nothing: the caller
/// then asks `scontrol`, which may run as the job's owner.
pub fn batch_script(id: u64) -> Option<Vec<u8>> {
    let lib = lib()?;
    let id = u32::try_from(id).ok()?;
    let l = lib.lock();
    let read = l.batch_script?;
    let mut buf: *mut c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: buf and len are valid out-pointers that stay alive until
    // the stream is closed below.
    let out = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if out.is_null() {
        return None;
    }
    // SAFETY: out is an open stream; the library writes the script to it.
    let rc = unsafe { read(out, id) };
    // SAFETY: out is open and closed once; after fclose, buf/len hold the
    // bytes written (a NUL-terminated buffer of len bytes, or null).
    let closed = unsafe { libc::fclose(out) };
    let script = (!buf.is_null()).then(|| {
        // SAFETY: buf holds len bytes written by the stream.
        let v = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
        // SAFETY: open_memstream's buffer is malloc'ed and ours to free.
        unsafe { libc::free(buf.cast()) };
        v
    });
    (rc == 0 && closed == 0).then_some(script?).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_follow_slurm() {
        assert_eq!(state_name(1), "RUNNING");
        assert_eq!(state_name(0), "PENDING");
        assert_eq!(state_name(11), "OUT_OF_MEMORY");
        // A running job whose epilog runs, or that is being signalled,
        // is not plainly RUNNING.
        assert_eq!(state_name(1 | (1 << 15)), "COMPLETING");
        assert_eq!(state_name(1 | (1 << 14)), "CONFIGURING");
        assert_eq!(state_name(1 << 11), "REQUEUE_HOLD");
        assert_eq!(state_name(200), "UNKNOWN");
    }

    #[test]
    fn releases_compare_major_and_minor_only() {
        assert_eq!(release(0x160508), (0x16, 5));
        assert_eq!(release(0x160508), release(0x160500));
        assert_ne!(release(0x160508), release(0x180b05));
        assert_eq!(api_of(release(0x160508)), Some(38));
        assert_eq!(api_of(release(0x180b05)), Some(42));
        assert_eq!(api_of((99, 1)), None);
    }
}
