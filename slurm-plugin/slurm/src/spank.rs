//! SPANK plugins: option registration and the `spank_plugin!` macro.
//!
//! Options are declared as a static table of [`OptSpec`]; one validator
//! function checks every value where the user typed it (sbatch/salloc/srun,
//! local context), so a bad value fails the command with a clear message
//! before anything reaches slurmctld.

use std::ffi::{c_char, c_int, CStr};
use std::panic::catch_unwind;

use crate::{alloc, log, sys};

/// One `--name[=arg]` option.
#[derive(Clone, Copy, Debug)]
pub struct OptSpec {
    pub name: &'static str,
    /// `Some("value")` for options that take an argument.
    pub arginfo: Option<&'static str>,
    pub usage: &'static str,
    /// Passed back to the validator to tell options apart.
    pub val: i32,
}

/// Validator: `(val, argument, remote) -> Ok or a message for the user`.
pub type Validator = fn(i32, Option<&str>, bool) -> Result<(), String>;

/// Register `opts` with Slurm. Called from `slurm_spank_init`.
///
/// # Safety
/// `sp` is the handle Slurm passed to `slurm_spank_init`.
pub unsafe fn register(name: &str, sp: sys::spank_t, opts: &[OptSpec], cb: sys::spank_opt_cb_f) -> c_int {
    for o in opts {
        // Slurm keeps pointers to these strings for the life of the
        // process, so they are allocated once and never freed.
        let opt = Box::leak(Box::new(sys::spank_option {
            name: alloc::xstrdup(o.name),
            arginfo: o.arginfo.map_or(std::ptr::null_mut(), alloc::xstrdup),
            usage: alloc::xstrdup(o.usage),
            has_arg: c_int::from(o.arginfo.is_some()),
            val: o.val,
            cb,
        }));
        // SAFETY: `sp` is the handle Slurm passed to slurm_spank_init and
        // `opt` is a valid, never-freed spank_option.
        let rc = unsafe { sys::spank_option_register(sp, opt) };
        if rc != 0 {
            log::verbose(&format!("spank/{name}: could not register --{} (rc {rc})", o.name));
        }
    }
    0
}

/// Body of the C option callback: decode, validate, report.
///
/// # Safety
/// `optarg` is NULL or a NUL-terminated string valid for the call.
pub unsafe fn run_callback(name: &str, validate: Validator, val: c_int, optarg: *const c_char, remote: c_int) -> c_int {
    let arg = if optarg.is_null() {
        None
    } else {
        // SAFETY: Slurm passes the option's NUL-terminated argument string.
        Some(unsafe { CStr::from_ptr(optarg) }.to_string_lossy().into_owned())
    };
    match catch_unwind(|| validate(val, arg.as_deref(), remote != 0)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            log::error(&msg);
            -1
        }
        Err(_) => {
            log::error(&format!("spank/{name}: option check panicked; option ignored"));
            0
        }
    }
}

/// Export a SPANK plugin that only adds options.
///
/// ```text
/// slurm::spank_plugin!("fleet", OPTIONS, validate);
/// ```
#[macro_export]
macro_rules! spank_plugin {
    ($name:literal, $opts:expr, $validate:path) => {
        #[no_mangle]
        #[used]
        pub static plugin_name: [u8; concat!($name, "\0").len()] = $crate::cstr_array(concat!($name, "\0"));
        #[no_mangle]
        #[used]
        pub static plugin_type: [u8; 6] = $crate::cstr_array("spank\0");
        #[no_mangle]
        #[used]
        pub static plugin_version: u32 = $crate::sys::SLURM_VERSION_NUMBER;

        extern "C" fn __fleet_spank_cb(
            val: ::std::ffi::c_int,
            optarg: *const ::std::ffi::c_char,
            remote: ::std::ffi::c_int,
        ) -> ::std::ffi::c_int {
            // SAFETY: Slurm passes NULL or the option's NUL-terminated argument.
            unsafe { $crate::spank::run_callback($name, $validate, val, optarg, remote) }
        }

        #[no_mangle]
        #[allow(clippy::not_unsafe_ptr_arg_deref)]
        pub extern "C" fn slurm_spank_init(
            sp: $crate::sys::spank_t,
            _ac: ::std::ffi::c_int,
            _av: *mut *mut ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            // SAFETY: `sp` is the handle Slurm passed to slurm_spank_init.
            ::std::panic::catch_unwind(|| unsafe { $crate::spank::register($name, sp, $opts, Some(__fleet_spank_cb)) })
                .unwrap_or(0)
        }
    };
}
