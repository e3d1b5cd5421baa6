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

/// The uid this process runs as: inside slurmctld, its `SlurmUser`.
pub fn process_uid() -> u32 {
    // SAFETY: getuid() takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}
