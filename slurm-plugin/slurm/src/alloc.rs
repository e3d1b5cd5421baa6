//! Strings handed to Slurm must come from Slurm's allocator: slurmctld
//! `xfree()`s every `job_desc` string and `err_msg` when it is done.
//!
//! `slurm_xstrdup`/`slurm_xfree` are exported by libslurmfull, which the
//! host process (slurmctld, slurmd, sbatch) has loaded before us. They are
//! looked up with `dlsym(RTLD_DEFAULT)` once; when absent (unit tests run
//! outside Slurm) libc's `strdup`/`free` stand in, consistently for both
//! directions, so a test's fake `job_desc` is still freed correctly.

use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

type XStrdup = unsafe extern "C" fn(*const c_char) -> *mut c_char;
type XFree = unsafe extern "C" fn(*mut *mut c_void);

#[derive(Clone, Copy)]
struct Allocator {
    strdup: XStrdup,
    free: XFree,
}

unsafe extern "C" fn libc_free(p: *mut *mut c_void) {
    // SAFETY: `p` points at a pointer that libc's strdup allocated (or NULL);
    // we free it once and clear it, as Slurm's xfree does.
    unsafe {
        libc::free(*p);
        *p = std::ptr::null_mut();
    }
}

fn allocator() -> Allocator {
    static A: OnceLock<Allocator> = OnceLock::new();
    *A.get_or_init(|| {
        let strdup = lookup(c"slurm_xstrdup");
        let free = lookup(c"slurm_xfree");
        match (strdup, free) {
            (Some(s), Some(f)) => Allocator {
                // SAFETY: both symbols come from libslurmfull with exactly these
                // C signatures (xstring.h, xmalloc.h since Slurm 20.11).
                strdup: unsafe { std::mem::transmute::<*mut c_void, XStrdup>(s) },
                // SAFETY: as above.
                free: unsafe { std::mem::transmute::<*mut c_void, XFree>(f) },
            },
            _ => Allocator { strdup: libc::strdup, free: libc_free },
        }
    })
}

/// Are strings handed to Slurm allocated by Slurm's own allocator? Always
/// inside a Slurm process; never in unit tests. A plugin that finds itself
/// called by Slurm without it must not write strings Slurm will `xfree`.
pub fn from_slurm() -> bool {
    lookup(c"slurm_xstrdup").is_some() && lookup(c"slurm_xfree").is_some()
}

pub(crate) fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// A C string allocated by Slurm's allocator, to be stored in a Slurm
/// structure (which then owns it). Interior NULs are dropped.
pub fn xstrdup(s: &str) -> *mut c_char {
    // A stand-in's script is tens of KiB: copied once when it holds no
    // NUL (always, but for hostile input), not filtered byte by byte.
    let bytes: Vec<u8> = if s.as_bytes().contains(&0) { s.bytes().filter(|&b| b != 0).collect() } else { s.into() };
    // Cannot fail: NULs were removed above.
    let c = std::ffi::CString::new(bytes).unwrap_or_default();
    // SAFETY: `c` is a valid NUL-terminated string; the allocator copies it.
    unsafe { (allocator().strdup)(c.as_ptr()) }
}

/// Free a Slurm-allocated string held in `*slot` and set it to NULL.
///
/// # Safety
/// `*slot` must be NULL or a string from Slurm's allocator (or, outside
/// Slurm, from [`xstrdup`]).
pub unsafe fn xfree(slot: *mut *mut c_char) {
    if slot.is_null() {
        return;
    }
    // SAFETY: per the contract above; xfree accepts NULL and clears the slot.
    unsafe { (allocator().free)(slot.cast()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dup_and_free_round_trip_outside_slurm() {
        let mut p = xstrdup("a\0b");
        // SAFETY: p was just allocated by xstrdup.
        let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
        assert_eq!(s, "ab");
        // SAFETY: p came from xstrdup.
        unsafe { xfree(&mut p) };
        assert!(p.is_null());
    }
}
