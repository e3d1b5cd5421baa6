//! Logging through slurmctld's own logger (`slurm_info` & co.), so our
//! lines land in slurmctld.log with its timestamps and levels. Outside a
//! Slurm process (unit tests) lines go to stderr.

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

type LogFn = unsafe extern "C" fn(*const c_char, ...);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Error,
    Info,
    Verbose,
    Debug,
}

fn resolve(level: Level) -> Option<LogFn> {
    // Addresses kept as usize: raw pointers are not Sync.
    static FNS: OnceLock<[usize; 4]> = OnceLock::new();
    let fns = FNS.get_or_init(|| {
        [c"slurm_error", c"slurm_info", c"slurm_verbose", c"slurm_debug"]
            .map(|n| crate::alloc::lookup(n).map_or(0, |p| p as usize))
    });
    let p = fns[level as usize];
    if p == 0 {
        return None;
    }
    let p = p as *mut c_void;
    // SAFETY: these symbols are Slurm's printf-style loggers,
    // `void f(const char *fmt, ...)` (log.h).
    Some(unsafe { std::mem::transmute::<*mut c_void, LogFn>(p) })
}

/// Write one line at `level`.
pub fn log(level: Level, msg: &str) {
    let c = CString::new(msg.replace('\0', "")).unwrap_or_default();
    match resolve(level) {
        // SAFETY: the format is a constant "%s" and the one argument a valid
        // NUL-terminated string, so the variadic call reads exactly one pointer.
        Some(f) => unsafe { f(c"%s".as_ptr(), c.as_ptr()) },
        None => eprintln!("{level:?}: {msg}"),
    }
}

pub fn error(msg: &str) {
    log(Level::Error, msg)
}
pub fn info(msg: &str) {
    log(Level::Info, msg)
}
pub fn verbose(msg: &str) {
    log(Level::Verbose, msg)
}
pub fn debug(msg: &str) {
    log(Level::Debug, msg)
}
