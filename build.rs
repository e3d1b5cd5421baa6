//! Build script of `slurm-plugin/slurm-sys` (referenced from its
//! Cargo.toml as `build = "../../build.rs"`): generates the Slurm
//! bindings with bindgen from the *installed* headers, so that the layout
//! of `job_desc_msg_t` — which changes in every Slurm release — always
//! matches the Slurm the plugins are built for.
//!
//! Header location: `$SLURM_INCLUDE_DIR` (a directory holding `slurm/slurm.h`),
//! else `/usr/include`, else `/usr/local/include`.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let wrapper = manifest.join("../../vendor-headers/fleet_slurm.h");
    println!("cargo:rerun-if-changed={}", wrapper.display());

    let include = find_include_dir().unwrap_or_else(|| {
        panic!(
            "Slurm headers not found: install libslurm-dev or set SLURM_INCLUDE_DIR \
             to the directory that holds slurm/slurm.h"
        )
    });
    // SLURM_VERSION_NUMBER comes through the bindings themselves; the
    // plugins export it as plugin_version and branch on it at run time
    // (e.g. job_modify's fourth argument, 23.02+).
    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("job_desc_msg_t")
        .allowlist_type("job_info_msg_t")
        .allowlist_type("slurm_job_info_t")
        .allowlist_type("spank_t")
        .allowlist_type("spank_option")
        .allowlist_type("spank_err_t")
        .allowlist_type("spank_context")
        .allowlist_function("spank_option_register")
        .allowlist_function("spank_context")
        .allowlist_function("spank_getenv")
        .allowlist_function("slurm_xstrdup")
        .allowlist_function("slurm_xfree")
        .allowlist_function("slurm_(info|verbose|debug|error)")
        .allowlist_var("SLURM_VERSION_NUMBER")
        .allowlist_var("JOB_STATE_BASE")
        .allowlist_var("FLEET_SHOW_ALL")
        .allowlist_var("NO_VAL(16|64)?")
        .allowlist_var("INFINITE(16|64)?")
        .allowlist_var("SLURM_(SUCCESS|ERROR)")
        .allowlist_var("ESPANK_.*")
        .allowlist_var("ESLURM_(INVALID_GRES|INVALID_PARTITION_NAME|REQUESTED_NODE_CONFIG_UNAVAILABLE|INVALID_LICENSES|ACCESS_DENIED|BAD_TASK_COUNT|INVALID_NODE_COUNT)")
        .allowlist_item("ESLURM_.*")
        .opaque_type("bitstr_t")
        .prepend_enum_name(false)
        .derive_debug(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen could not generate the Slurm bindings");
    // Fields of job_desc_msg_t that some supported release lacks get an
    // accessor here, so that the safe layer compiles against every one.
    let mut code = bindings.to_string();
    code.push_str(if code.contains("pub power_flags:") {
        "/// `job_desc_msg_t::power_flags` (`--power`; removed in Slurm 23.11).\n\
         pub fn job_desc_power_flags(r: &job_desc_msg_t) -> u8 { r.power_flags }\n\
         /// Sets `power_flags` (a no-op where Slurm has no such field).\n\
         pub fn job_desc_set_power_flags(r: &mut job_desc_msg_t, v: u8) { r.power_flags = v; }\n"
    } else {
        "/// `job_desc_msg_t::power_flags` (`--power`): this Slurm (23.11+) has none, so 0.\n\
         pub fn job_desc_power_flags(_: &job_desc_msg_t) -> u8 { 0 }\n\
         /// Sets `power_flags` (a no-op where Slurm has no such field).\n\
         pub fn job_desc_set_power_flags(_: &mut job_desc_msg_t, _: u8) {}\n"
    });
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("slurm_bindings.rs");
    std::fs::write(&out, code).expect("could not write the Slurm bindings");
}

fn find_include_dir() -> Option<PathBuf> {
    let candidates = env::var_os("SLURM_INCLUDE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/usr/include"), PathBuf::from("/usr/local/include")]);
    candidates.into_iter().find(|d| d.join("slurm/slurm.h").is_file())
}
