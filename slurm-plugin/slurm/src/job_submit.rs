//! job_submit plugins: a trait with defaulted hooks, entry points that
//! never unwind into C, and the macro that exports the symbols slurmctld
//! looks for (`plugin_name`, `plugin_type`, `plugin_version`, `init`,
//! `fini`, `job_submit`, `job_modify`).
//!
//! `job_submit` runs under slurmctld's job and partition write locks: an
//! implementation must bound its own time (Fleet's does: a hard deadline on
//! one local Unix-socket round trip).

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{RwLock, RwLockReadGuard};

use crate::job_desc::JobDesc;
use crate::sys::job_desc_msg_t;
use crate::{alloc, log, SLURM_ERROR, SLURM_SUCCESS};

/// A refusal: Slurm error code and the text sbatch prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub code: i32,
    pub message: String,
}

pub trait JobSubmitPlugin: Sized + Send + Sync + 'static {
    /// Called once from `init()`. An error is logged and the plugin then
    /// passes every job through untouched (fail open).
    fn init() -> Result<Self, String>;

    fn submit(&self, _job: &mut JobDesc<'_>, _submit_uid: u32) -> Result<(), Reject> {
        Ok(())
    }

    fn modify(&self, _job: &mut JobDesc<'_>, _submit_uid: u32) -> Result<(), Reject> {
        Ok(())
    }

    fn fini(&self) {}
}

/// The per-plugin instance slot (one per .so: each plugin crate expands
/// the macro once and gets its own static).
///
/// slurmctld unloads and loads the plugin again (`fini()` then `init()`)
/// whenever `JobSubmitPlugins` changes at `scontrol reconfigure`, but
/// `dlclose` does not unmap a Rust library (glibc keeps a library that
/// registered thread-local destructors), so this static outlives `fini()`.
/// Each `init()` therefore installs a new instance and `fini()` drops it:
/// a plugin is never called after its `fini()`, and state kept in the
/// instance (threads, caches, statistics) starts afresh at each load.
pub struct Slot<P> {
    // std RwLock: slurmctld calls init/fini and job_submit from its own
    // threads; a hook holds the read side for the call only.
    inner: RwLock<Option<P>>,
}

impl<P: JobSubmitPlugin> Default for Slot<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: JobSubmitPlugin> Slot<P> {
    pub const fn new() -> Self {
        Slot { inner: RwLock::new(None) }
    }

    /// The instance for one hook call (`None`: init failed, or not loaded).
    /// A read guard is never poisoned by a panic in the hook (caught
    /// inside anyway); a poisoned write side still holds a whole value.
    fn get(&self) -> RwLockReadGuard<'_, Option<P>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Entry point for `init()`: a new instance (an instance still there,
    /// from an `init()` without `fini()`, is finished first).
    pub fn init(&self, name: &str) -> i32 {
        self.fini(name);
        // Called by slurmctld: the strings we hand it must come from its
        // xmalloc, or its xfree corrupts its heap. Should libslurmfull not
        // export them, the plugin stays off (every job untouched). (This
        // crate's own tests run the slot outside Slurm, with libc's.)
        if !cfg!(test) && !crate::alloc::from_slurm() {
            log::error(&format!(
                "{name}: slurm_xstrdup/slurm_xfree not found in this process; passing every job through untouched"
            ));
            return SLURM_SUCCESS;
        }
        let r = catch_unwind(|| P::init());
        let p = match r {
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) => {
                log::error(&format!("{name}: init failed, passing every job through untouched: {e}"));
                None
            }
            Err(_) => {
                log::error(&format!("{name}: init panicked, passing every job through untouched"));
                None
            }
        };
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = p;
        SLURM_SUCCESS
    }

    /// Entry point for `fini()`: the instance's `fini`, then it is dropped
    /// (so that it can stop what it started before the library goes).
    pub fn fini(&self, name: &str) -> i32 {
        let taken = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = taken {
            if catch_unwind(AssertUnwindSafe(move || {
                p.fini();
                drop(p);
            }))
            .is_err()
            {
                log::error(&format!("{name}: fini panicked"));
            }
        }
        SLURM_SUCCESS
    }

    /// Entry point for `job_submit()`. Never unwinds; a panic in the
    /// plugin leaves the job as submitted (fail open).
    ///
    /// # Safety
    /// `job_desc` is NULL or a valid job descriptor exclusively ours for the
    /// call; `err_msg` is NULL or a valid `char **` slurmctld will `xfree`.
    pub unsafe fn submit(&self, name: &str, job_desc: *mut job_desc_msg_t, uid: u32, err_msg: *mut *mut c_char) -> i32 {
        let guard = self.get();
        let Some(p) = guard.as_ref() else {
            return SLURM_SUCCESS;
        };
        // SAFETY: slurmctld passes its job_desc, valid and exclusively ours
        // for the duration of the call.
        let Some(mut job) = (unsafe { JobDesc::from_raw(job_desc) }) else {
            return SLURM_SUCCESS;
        };
        match catch_unwind(AssertUnwindSafe(|| p.submit(&mut job, uid))) {
            Ok(Ok(())) => SLURM_SUCCESS,
            Ok(Err(rej)) => {
                set_err_msg(err_msg, &rej.message);
                if rej.code == 0 {
                    SLURM_ERROR
                } else {
                    rej.code
                }
            }
            Err(_) => {
                log::error(&format!("{name}: job_submit panicked; job left as submitted"));
                SLURM_SUCCESS
            }
        }
    }

    /// Entry point for `job_modify()`. Slurm 22.05 calls it with three
    /// arguments, 23.02+ with a fourth (`char **err_msg`); `err_msg` is
    /// only touched when the headers we were built against have it.
    ///
    /// # Safety
    /// As [`Slot::submit`].
    pub unsafe fn modify(&self, name: &str, job_desc: *mut job_desc_msg_t, uid: u32, err_msg: *mut *mut c_char) -> i32 {
        let guard = self.get();
        let Some(p) = guard.as_ref() else {
            return SLURM_SUCCESS;
        };
        // SAFETY: as in `submit`.
        let Some(mut job) = (unsafe { JobDesc::from_raw(job_desc) }) else {
            return SLURM_SUCCESS;
        };
        match catch_unwind(AssertUnwindSafe(|| p.modify(&mut job, uid))) {
            Ok(Ok(())) => SLURM_SUCCESS,
            Ok(Err(rej)) => {
                if crate::sys::SLURM_VERSION_NUMBER >= 0x17_02_00 {
                    set_err_msg(err_msg, &rej.message);
                } else {
                    log::info(&format!("{name}: job_modify refused: {}", rej.message));
                }
                if rej.code == 0 {
                    SLURM_ERROR
                } else {
                    rej.code
                }
            }
            Err(_) => {
                log::error(&format!("{name}: job_modify panicked; update left as requested"));
                SLURM_SUCCESS
            }
        }
    }
}

fn set_err_msg(err_msg: *mut *mut c_char, msg: &str) {
    if err_msg.is_null() {
        return;
    }
    // SAFETY: slurmctld passes a valid `char **` whose target is NULL or an
    // xmalloc'ed string it will xfree; we replace it with one from xstrdup.
    unsafe {
        alloc::xfree(err_msg);
        *err_msg = alloc::xstrdup(msg);
    }
}

/// Export a job_submit plugin.
///
/// ```text
/// slurm::job_submit_plugin!(MyPlugin, "Fleet federation", "job_submit/fleet");
/// ```
#[macro_export]
macro_rules! job_submit_plugin {
    ($ty:ty, $name:literal, $ptype:literal) => {
        #[no_mangle]
        #[used]
        pub static plugin_name: [u8; concat!($name, "\0").len()] = $crate::cstr_array(concat!($name, "\0"));
        #[no_mangle]
        #[used]
        pub static plugin_type: [u8; concat!($ptype, "\0").len()] = $crate::cstr_array(concat!($ptype, "\0"));
        /// Must equal the SLURM_VERSION_NUMBER of the slurmctld that loads us.
        #[no_mangle]
        #[used]
        pub static plugin_version: u32 = $crate::sys::SLURM_VERSION_NUMBER;

        static __FLEET_SLOT: $crate::job_submit::Slot<$ty> = $crate::job_submit::Slot::new();

        #[no_mangle]
        pub extern "C" fn init() -> ::std::ffi::c_int {
            __FLEET_SLOT.init($ptype)
        }

        #[no_mangle]
        pub extern "C" fn fini() -> ::std::ffi::c_int {
            __FLEET_SLOT.fini($ptype)
        }

        #[no_mangle]
        #[allow(clippy::not_unsafe_ptr_arg_deref)]
        pub extern "C" fn job_submit(
            job_desc: *mut $crate::sys::job_desc_msg_t,
            submit_uid: u32,
            err_msg: *mut *mut ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // SAFETY: slurmctld calls job_submit with its job descriptor and
            // err_msg slot, valid for the call.
            unsafe { __FLEET_SLOT.submit($ptype, job_desc, submit_uid, err_msg) }
        }

        #[no_mangle]
        #[allow(clippy::not_unsafe_ptr_arg_deref)]
        pub extern "C" fn job_modify(
            job_desc: *mut $crate::sys::job_desc_msg_t,
            _job_ptr: *mut ::std::ffi::c_void,
            submit_uid: u32,
            err_msg: *mut *mut ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // SAFETY: as job_submit; err_msg is only read when the headers
            // say slurmctld passes it (23.02+).
            unsafe { __FLEET_SLOT.modify($ptype, job_desc, submit_uid, err_msg) }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static INITS: AtomicU32 = AtomicU32::new(0);
    static FINIS: AtomicU32 = AtomicU32::new(0);

    /// Counts its own calls; says which load it is in the reject message.
    struct Counting {
        load: u32,
        calls: AtomicU32,
    }

    impl JobSubmitPlugin for Counting {
        fn init() -> Result<Self, String> {
            Ok(Counting { load: INITS.fetch_add(1, Ordering::SeqCst) + 1, calls: AtomicU32::new(0) })
        }
        fn submit(&self, _job: &mut JobDesc<'_>, _uid: u32) -> Result<(), Reject> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            Err(Reject { code: 7, message: format!("load {} call {n}", self.load) })
        }
        fn fini(&self) {
            FINIS.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The message `job_submit` leaves in err_msg (None: the job passed).
    fn submit(slot: &Slot<Counting>) -> Option<String> {
        let mut d = JobDesc::test_descriptor();
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: a valid test descriptor and err_msg slot, ours for the call.
        let rc = unsafe { slot.submit("test", &mut *d, 1000, &mut err) };
        if err.is_null() {
            assert_eq!(rc, SLURM_SUCCESS);
            return None;
        }
        assert_eq!(rc, 7);
        // SAFETY: set_err_msg stored a NUL-terminated string from xstrdup.
        let msg = unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy().into_owned();
        // SAFETY: `err` came from xstrdup; xfree frees and clears it.
        unsafe { alloc::xfree(&mut err) };
        Some(msg)
    }

    #[test]
    fn each_load_gets_a_new_instance_and_none_is_called_after_its_fini() {
        // slurmctld at `scontrol reconfigure` with JobSubmitPlugins changed:
        // fini(), then init() again, while the library stays mapped.
        let slot: Slot<Counting> = Slot::new();
        assert_eq!(submit(&slot), None, "not loaded: every job passes");
        slot.init("test");
        assert_eq!(submit(&slot).as_deref(), Some("load 1 call 1"));
        assert_eq!(submit(&slot).as_deref(), Some("load 1 call 2"));
        slot.fini("test");
        assert_eq!(FINIS.load(Ordering::SeqCst), 1);
        assert_eq!(submit(&slot), None, "finished: never called again");
        slot.init("test");
        assert_eq!(submit(&slot).as_deref(), Some("load 2 call 1"), "the new load's instance, fresh");
        // init() without fini(): the old instance is finished first.
        slot.init("test");
        assert_eq!(FINIS.load(Ordering::SeqCst), 2);
        assert_eq!(submit(&slot).as_deref(), Some("load 3 call 1"));
        slot.fini("test");
        slot.fini("test");
        assert_eq!(FINIS.load(Ordering::SeqCst), 3, "a second fini finds nothing to finish");
    }
}
