//! From `job_desc_msg_t` to a [`JobRequest`] for the agent.

use fleet_api::{FleetMode, JobRequest};
use slurm::job_desc::{JobDesc, NumField, StrField};
use slurm::job_submit::Reject;
use slurm::{sys, NO_VAL, NO_VAL16};

use crate::PluginConfig;

/// What the plugin does with a submission before asking anyone.
#[derive(Debug, PartialEq)]
pub enum Prepared {
    /// Leave it exactly as submitted; the agent is not asked.
    Untouched,
    /// Ask the agent about this request.
    Ask(Box<JobRequest>),
}

fn opt_u32(v: u64, no_val: u64) -> Option<u32> {
    (v != no_val && v != 0).then_some(v as u32)
}

/// Read the submission. Errors are the user's: bad `--fleet*` values or a
/// GPU request that does not parse; they reject the job with a message.
pub fn build_request(job: &mut JobDesc<'_>, config: &PluginConfig) -> Result<Prepared, Reject> {
    // salloc / srun allocations carry no batch script: left alone.
    if !job.is_batch() {
        return Ok(Prepared::Untouched);
    }
    let spank = job.spank_env();
    let fleet = fleet_api::options::from_spank_env(spank.iter().map(String::as_str))
        .map_err(|m| Reject { code: slurm::SLURM_ERROR, message: format!("fleet: {m}") })?;
    if fleet.mode == FleetMode::Local {
        return Ok(Prepared::Untouched);
    }
    let is_array = job.bytes(StrField::ArrayInx).is_some_and(|b| !b.is_empty());
    if is_array {
        // Arrays stay local for now; say so if the user asked otherwise.
        if fleet != Default::default() {
            slurm::log::verbose("job_submit/fleet: job arrays stay local; --fleet options ignored");
        }
        return Ok(Prepared::Untouched);
    }
    let tres: Vec<(StrField, Option<String>)> = [StrField::TresPerJob, StrField::TresPerNode, StrField::TresPerTask, StrField::TresPerSocket]
        .into_iter()
        .map(|f| (f, job.get(f).map(|s| s.into_owned())))
        .collect();
    let gpus = slurm_conf::tres::parse_job_tres(tres[0].1.as_deref(), tres[1].1.as_deref(), tres[2].1.as_deref(), tres[3].1.as_deref())
        .map_err(|e| Reject { code: sys::ESLURM_INVALID_GRES as i32, message: format!("fleet: {e}") })?;
    if gpus.is_empty() && fleet == Default::default() {
        return Ok(Prepared::Untouched);
    }

    let mut non_utf8 = Vec::new();
    let mut text = |job: &mut JobDesc<'_>, f: StrField| -> Option<String> {
        if !job.is_utf8(f) {
            non_utf8.push(f.name().to_string());
        }
        job.get(f).map(|s| s.into_owned())
    };
    let account = text(job, StrField::Account);
    let partition = text(job, StrField::Partition);
    let name = text(job, StrField::Name);
    let work_dir = text(job, StrField::WorkDir);
    let std_out = text(job, StrField::StdOut);
    let std_err = text(job, StrField::StdErr);
    let script_bytes = job.bytes(StrField::Script).map(<[u8]>::to_vec).unwrap_or_default();
    let (script, script_len) = if script_bytes.len() as u64 > config.max_script_bytes {
        (None, Some(script_bytes.len() as u64))
    } else {
        (Some(script_bytes), None)
    };
    let (env, env_dropped) = environment(job);
    let tres_raw = tres
        .into_iter()
        .filter_map(|(f, v)| v.map(|v| (f.name().to_string(), v)))
        .collect();

    Ok(Prepared::Ask(Box::new(JobRequest {
        origin: config.site.clone(),
        user_id: job.num(NumField::UserId) as u32,
        group_id: job.num(NumField::GroupId) as u32,
        user_name: None,
        account,
        partition,
        name,
        min_nodes: opt_u32(job.num(NumField::MinNodes), NO_VAL.into()),
        max_nodes: opt_u32(job.num(NumField::MaxNodes), NO_VAL.into()),
        num_tasks: opt_u32(job.num(NumField::NumTasks), NO_VAL.into()),
        ntasks_per_node: opt_u32(job.num(NumField::NtasksPerNode), NO_VAL16.into()),
        cpus_per_task: opt_u32(job.num(NumField::CpusPerTask), NO_VAL16.into()),
        time_limit_min: opt_u32(job.num(NumField::TimeLimit), NO_VAL.into()).filter(|&t| t != slurm::INFINITE),
        gpus,
        tres_raw,
        script,
        script_len,
        work_dir,
        std_out,
        std_err,
        env,
        env_dropped,
        is_array,
        non_utf8_fields: non_utf8,
        fleet,
    })))
}

/// The job's environment as the target will need it: UTF-8 entries up to
/// `MAX_ENV_BYTES` in all; the number left out is the second value.
fn environment(job: &JobDesc<'_>) -> (Vec<String>, u32) {
    let (mut env, mut dropped, mut bytes) = (Vec::new(), 0u32, 0usize);
    for entry in job.environment() {
        match std::str::from_utf8(entry) {
            Ok(s) if bytes + s.len() <= fleet_api::job::MAX_ENV_BYTES => {
                bytes += s.len();
                env.push(s.to_string());
            }
            _ => dropped += 1,
        }
    }
    (env, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::{GpuRequest, GpuScope};
    use slurm::job_desc::free_test_descriptor;

    fn config() -> PluginConfig {
        PluginConfig::for_tests("beta")
    }

    /// Build a descriptor from (field, value) pairs and run `build_request`.
    fn run(fields: &[(StrField, &str)], spank: &[&str]) -> Result<Prepared, Reject> {
        let mut d = JobDesc::test_descriptor();
        let env: Vec<std::ffi::CString> = spank.iter().map(|s| std::ffi::CString::new(*s).unwrap()).collect();
        let mut ptrs: Vec<*mut std::ffi::c_char> = env.iter().map(|c| c.as_ptr() as *mut _).collect();
        d.spank_job_env = if ptrs.is_empty() { std::ptr::null_mut() } else { ptrs.as_mut_ptr() };
        d.spank_job_env_size = ptrs.len() as u32;
        let out = {
            let mut jd = JobDesc::from_box(&mut d);
            for (f, v) in fields {
                jd.set(*f, Some(v));
            }
            build_request(&mut jd, &config())
        };
        d.spank_job_env = std::ptr::null_mut();
        d.spank_job_env_size = 0;
        free_test_descriptor(d);
        out
    }

    fn gpus(p: &Prepared) -> Vec<GpuRequest> {
        match p {
            Prepared::Ask(r) => r.gpus.clone(),
            Prepared::Untouched => vec![],
        }
    }

    const SCRIPT: (StrField, &str) = (StrField::Script, "#!/bin/sh\ntrue\n");

    #[test]
    fn the_environment_travels_utf8_and_bounded() {
        let big = format!("BIG={}", "x".repeat(fleet_api::job::MAX_ENV_BYTES));
        let entries: Vec<Vec<u8>> = vec![b"PATH=/usr/bin".to_vec(), b"BAD=\xff\xfe".to_vec(), big.into_bytes(), b"LAST=1".to_vec()];
        let env: Vec<std::ffi::CString> = entries.into_iter().map(|e| std::ffi::CString::new(e).unwrap()).collect();
        let mut ptrs: Vec<*mut std::ffi::c_char> = env.iter().map(|c| c.as_ptr() as *mut _).collect();
        let mut d = JobDesc::test_descriptor();
        d.environment = ptrs.as_mut_ptr();
        d.env_size = ptrs.len() as u32;
        let out = {
            let mut jd = JobDesc::from_box(&mut d);
            jd.set(SCRIPT.0, Some(SCRIPT.1));
            jd.set(StrField::TresPerNode, Some("gres:gpu:h100:8"));
            build_request(&mut jd, &config())
        };
        d.environment = std::ptr::null_mut();
        d.env_size = 0;
        free_test_descriptor(d);
        let Ok(Prepared::Ask(r)) = out else { panic!("{out:?}") };
        assert_eq!(r.env, ["PATH=/usr/bin", "LAST=1"]);
        assert_eq!(r.env_dropped, 2, "the non-UTF-8 entry and the one past the cap");
    }

    #[test]
    fn what_is_left_alone() {
        // No script: salloc/srun.
        assert_eq!(run(&[(StrField::TresPerNode, "gres:gpu:h100:8")], &[]), Ok(Prepared::Untouched));
        // No GPUs, no options.
        assert_eq!(run(&[SCRIPT], &[]), Ok(Prepared::Untouched));
        // --fleet=local.
        assert_eq!(
            run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8")], &["_SLURM_SPANK_OPTION_fleet_fleet=local"]),
            Ok(Prepared::Untouched)
        );
        // Arrays.
        assert_eq!(run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8"), (StrField::ArrayInx, "1-4")], &[]), Ok(Prepared::Untouched));
    }

    #[test]
    fn gpu_forms_are_read() {
        let node = GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node };
        assert_eq!(gpus(&run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:8")], &[]).unwrap()), vec![node.clone()]);
        assert_eq!(gpus(&run(&[SCRIPT, (StrField::TresPerNode, "gres/gpu:h100:8")], &[]).unwrap()), vec![node]);
        assert_eq!(
            gpus(&run(&[SCRIPT, (StrField::TresPerJob, "gres:gpu:8")], &[]).unwrap()),
            vec![GpuRequest { gpu_type: None, count: 8, scope: GpuScope::Job }]
        );
        assert_eq!(
            gpus(&run(&[SCRIPT, (StrField::TresPerTask, "gres:gpu:1")], &[]).unwrap()),
            vec![GpuRequest { gpu_type: None, count: 1, scope: GpuScope::Task }]
        );
    }

    #[test]
    fn user_errors_reject_with_a_message() {
        let e = run(&[SCRIPT, (StrField::TresPerNode, "gres:gpu:h100:x")], &[]).unwrap_err();
        assert!(e.message.starts_with("fleet: bad GPU request \"gres:gpu:h100:x\""), "{}", e.message);
        assert_eq!(e.code, sys::ESLURM_INVALID_GRES as i32);
        let e = run(&[SCRIPT], &["_SLURM_SPANK_OPTION_fleet_fleet=sideways"]).unwrap_err();
        assert_eq!(e.message, "fleet: --fleet=sideways: expected auto, local or remote");
    }

    #[test]
    fn options_alone_ask_the_agent_and_large_scripts_are_not_sent() {
        let big = format!("#!/bin/sh\n{}", "x".repeat(2 << 20));
        let p = run(&[(StrField::Script, &big)], &["_SLURM_SPANK_OPTION_fleet_fleet_to=alpha"]).unwrap();
        let Prepared::Ask(r) = p else { panic!("expected Ask") };
        assert_eq!(r.fleet.to, vec!["alpha".to_string()]);
        assert_eq!(r.script, None);
        assert_eq!(r.script_len, Some(big.len() as u64));
        assert_eq!(r.origin, "beta");
    }
}
