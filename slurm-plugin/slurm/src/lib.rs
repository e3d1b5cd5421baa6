//! The safe layer between Slurm's C ABI and Fleet's plugins.
//!
//! * [`alloc`]: strings handed to Slurm come from Slurm's allocator.
//! * [`log`]: Slurm's own logger (falls back to stderr outside Slurm).
//! * [`job_desc`]: typed access to `job_desc_msg_t`.
//! * [`job_submit`]: the `job_submit_plugin!` macro and its entry points,
//!   every one inside `catch_unwind`.
//! * [`spank`]: the `spank_plugin!` macro, option registration.
//!
//! The plugin crates (`job-submit-fleet`, `spank-fleet`) contain no
//! `unsafe`; everything unsafe lives here, each block with its SAFETY note.

pub mod alloc;
pub mod job_desc;
pub mod job_submit;
pub mod log;
pub mod spank;

pub use slurm_sys as sys;

/// Copy a NUL-terminated literal into a fixed `char[]`, for the
/// `plugin_name`/`plugin_type` symbols that Slurm reads as arrays.
pub const fn cstr_array<const N: usize>(s: &str) -> [u8; N] {
    let b = s.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < b.len() && i < N {
        out[i] = b[i];
        i += 1;
    }
    out
}

/// Slurm's "no value" markers.
pub const NO_VAL: u32 = 0xffff_fffe;
pub const NO_VAL16: u16 = 0xfffe;
pub const NO_VAL64: u64 = 0xffff_ffff_ffff_fffe;
pub const INFINITE: u32 = 0xffff_ffff;
pub const SLURM_SUCCESS: i32 = 0;
pub const SLURM_ERROR: i32 = -1;

/// The name of `uid` in the passwd database (NSS `getpwuid_r`, as
/// slurmctld itself resolves users), or `None`. It may block on a
/// directory service: never call it from a hook under slurmctld's locks
/// (the job_submit plugin calls it from its watcher thread).
pub fn user_name_of(uid: u32) -> Option<String> {
    let mut buf: Vec<libc::c_char> = vec![0; 4096];
    loop {
        // SAFETY: an all-zero passwd is a valid value (null pointers, zero ids).
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: pw, buf (with its true length) and out are valid for
        // writes for the whole call; the strings are written into buf.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 || out.is_null() || pw.pw_name.is_null() {
            return None;
        }
        // SAFETY: on success pw_name points to a NUL-terminated string in
        // buf, which outlives this borrow.
        let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
        return name.to_str().ok().map(str::to_string);
    }
}

/// The uid this process runs as: inside slurmctld, its `SlurmUser`.
pub fn process_uid() -> u32 {
    // SAFETY: getuid() takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}
