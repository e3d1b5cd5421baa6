//! The sbatch options that reproduce a forwarded job at its target.
//!
//! [`sbatch_options`] turns a [`JobRequest`] back into the command-line
//! options the user's job carried: GPUs (per job, node, task, socket),
//! the node range, tasks, CPUs, memory, `--exclusive`, `--oversubscribe`,
//! `--contiguous`, `--constraint`, `--signal`, `--comment`, mail, time
//! limit, `--time-min` and the `--export` mode. It never emits output
//! paths, `--chdir`, `--job-name` or Fleet's own tags: the target agent
//! adds those. Every option is one `--name=value` argument (never a
//! separate value argument), so a hostile value cannot become an option.
//!
//! What a target cannot honour is not emitted here: the plugin lists it
//! in [`JobRequest::not_carried`] and the placement rule keeps such a job
//! home (or refuses it, naming the option, when home cannot run it).

use crate::{Exclusive, ExportMode, GpuScope, JobRequest};

/// Slurm's `MAIL_JOB_*` bits, in `--mail-type` spelling.
pub const MAIL_TYPES: &[(u16, &str)] = &[
    (1 << 0, "BEGIN"),
    (1 << 1, "END"),
    (1 << 2, "FAIL"),
    (1 << 3, "REQUEUE"),
    (1 << 4, "TIME_LIMIT"),
    (1 << 5, "TIME_LIMIT_90"),
    (1 << 6, "TIME_LIMIT_80"),
    (1 << 7, "TIME_LIMIT_50"),
    (1 << 8, "STAGE_OUT"),
    (1 << 9, "ARRAY_TASKS"),
    (1 << 10, "INVALID_DEPEND"),
];

/// `MAIL_JOB_BEGIN`.
pub const MAIL_BEGIN: u16 = 1 << 0;
/// `MAIL_JOB_TIME90`, `MAIL_JOB_TIME80`, `MAIL_JOB_TIME50`.
pub const MAIL_TIME_LIMIT_FRACTIONS: u16 = (1 << 5) | (1 << 6) | (1 << 7);

/// Slurm's `secs2time_str`: `HH:MM:SS`, with `D-` in front past a day
/// (how `squeue`, `scontrol` and Slurm's mails print a duration).
pub fn duration_text(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// `--mail-type` names as bits (unknown names are none).
pub fn mail_type_bits(names: &str) -> u16 {
    names.split(',').filter_map(|n| MAIL_TYPES.iter().find(|(_, m)| *m == n.trim())).fold(0, |a, (b, _)| a | b)
}

/// The mails the job's stand-in sends (its `fleet-proxy`, [`proxy_mail_args`])
/// rather than Slurm at home, as `MAIL_TYPES` bits: the plugin takes them
/// out of the stand-in's mail type. Only for mail to the submitting user
/// (no `--mail-user`: with one, the target mails it) and only for a single
/// job (an array's mails are Slurm's, once for the array or per task):
/// * BEGIN: Slurm would send it when the stand-in starts, which is when the
///   job leaves, not when it begins at its target;
/// * TIME_LIMIT_50/80/90: the stand-in has no limit of its own (so that the
///   job's wait at its target does not count), so Slurm would never send
///   them. The proxy sends them at those shares of the run's limit at its
///   target as its agent reports it (`JobRecord::time_limit_min`: the
///   job's `--time`, or without one that cluster's default limit), or of
///   the stand-in's own limit where that is lower.
pub fn proxy_mail_bits(req: &JobRequest) -> u16 {
    if req.mail_user.as_deref().is_some_and(|u| !u.is_empty()) || req.is_array {
        return 0;
    }
    let bits = req.mail_type.as_deref().map_or(0, mail_type_bits);
    bits & (MAIL_BEGIN | MAIL_TIME_LIMIT_FRACTIONS)
}

/// `fleet-proxy`'s arguments for [`proxy_mail_bits`]: ` --mail-type=BEGIN,...`
/// and, for time-limit mails of a job with `--time`, ` --time-limit-min=N`
/// (the limit until its target reports one); empty for none.
pub fn proxy_mail_args(req: &JobRequest) -> String {
    let bits = proxy_mail_bits(req);
    let Some(names) = mail_type_names(bits) else { return String::new() };
    match req.time_limit_min {
        Some(t) if bits & MAIL_TIME_LIMIT_FRACTIONS != 0 => format!(" --mail-type={names} --time-limit-min={t}"),
        _ => format!(" --mail-type={names}"),
    }
}

/// `job_desc.mail_type` bits as `--mail-type` takes them (`None` for 0
/// or `NO_VAL16`).
pub fn mail_type_names(bits: u16) -> Option<String> {
    if bits == 0 || bits == u16::MAX - 1 {
        return None;
    }
    let names: Vec<&str> = MAIL_TYPES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| *n).collect();
    (!names.is_empty()).then(|| names.join(","))
}

/// The `--export=` value for the target: the job's own mode, plus
/// `extra` variables (Fleet's, e.g. `FLEET_JOB_ID`) where the mode lets
/// variables be named. `NONE` with extras becomes the list of extras
/// (Slurm: only `SLURM_*` and the named variables, as `NONE` gives only
/// `SLURM_*`); `NIL` cannot name variables and stays `NIL`.
///
/// A list without `ALL` names variables that sbatch looked up in the
/// submitter's environment at home (`--export=PATH,DATA`): at the target
/// each is given with the value it had there (`PATH=<theirs>`), taken from
/// the environment the job carries, where the value can travel in the
/// list ([`export_inline`]); sbatch there would otherwise look the name up
/// in its own environment, the agent's. A name left bare (its value
/// cannot travel, or it is a `SLURM_*` one, or the job did not have it)
/// is the agent's to supply ([`export_lookups`]).
pub fn export_value(req: &JobRequest, extra: &[(&str, &str)]) -> String {
    let extras: Vec<String> = extra.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let join = |head: Vec<String>| head.into_iter().chain(extras.iter().cloned()).collect::<Vec<_>>().join(",");
    match req.export_mode() {
        ExportMode::All => join(vec!["ALL".into()]),
        ExportMode::None if extras.is_empty() => "NONE".into(),
        ExportMode::None => join(vec![]),
        ExportMode::Nil => "NIL".into(),
        ExportMode::List { all: true, items } => join(std::iter::once("ALL".to_string()).chain(items).collect()),
        ExportMode::List { all: false, items } => join(
            items
                .into_iter()
                .map(|name| match looked_up(req, &name) {
                    Some(v) if export_inline(v) => format!("{name}={v}"),
                    _ => name,
                })
                .collect(),
        ),
    }
}

/// A value that can be given inline in sbatch's `--export` list, which
/// sbatch splits at commas outside quotes.
pub fn export_inline(value: &str) -> bool {
    !value.contains([',', '"', '\''])
}

/// The value of a bare `name` of an `--export` list without `ALL`, as the
/// submitter's environment had it (the environment the job carries), for
/// a name that is not Slurm's own (`SLURM_*`: sbatch adds its own there).
fn looked_up<'a>(req: &'a JobRequest, name: &str) -> Option<&'a str> {
    if name.contains('=') || name.starts_with("SLURM_") || name.is_empty() {
        return None;
    }
    req.env.iter().find_map(|e| e.strip_prefix(name)?.strip_prefix('='))
}

/// The names of an `--export` list without `ALL` that [`export_value`]
/// leaves bare although the job carries a value for them (one that cannot
/// travel inline), with that value: the target's sbatch looks them up in
/// its own environment, where the agent puts them.
pub fn export_lookups(req: &JobRequest) -> Vec<(String, String)> {
    match req.export_mode() {
        ExportMode::List { all: false, items } => items
            .into_iter()
            .filter_map(|name| {
                let v = looked_up(req, &name).filter(|v| !export_inline(v))?.to_string();
                Some((name, v))
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn gpu_spec(t: Option<&str>, n: u32) -> String {
    match t {
        Some(t) => format!("{t}:{n}"),
        None => n.to_string(),
    }
}

/// The sbatch options that reproduce `req`'s resources and settings at a
/// target, with `--export` in the job's own mode (see
/// [`sbatch_options_with_env`] to add Fleet's variables).
pub fn sbatch_options(req: &JobRequest) -> Vec<String> {
    sbatch_options_with_env(req, &[])
}

/// [`sbatch_options`] with `extra` variables named in `--export`.
pub fn sbatch_options_with_env(req: &JobRequest, extra: &[(&str, &str)]) -> Vec<String> {
    let mut a = Vec::new();
    // GPUs, each scope as one option (several types comma-joined).
    for (scope, opt) in [
        (GpuScope::Job, "--gpus"),
        (GpuScope::Node, "--gres"),
        (GpuScope::Task, "--gpus-per-task"),
        (GpuScope::Socket, "--gpus-per-socket"),
    ] {
        let specs: Vec<String> = req
            .gpus
            .iter()
            .filter(|g| g.scope == scope)
            .map(|g| {
                let s = gpu_spec(g.gpu_type.as_deref(), g.count);
                if scope == GpuScope::Node {
                    format!("gpu:{s}")
                } else {
                    s
                }
            })
            .collect();
        if !specs.is_empty() {
            a.push(format!("{opt}={}", specs.join(",")));
        }
    }
    if let Some(n) = req.min_nodes {
        match req.max_nodes.filter(|&m| m > n) {
            Some(m) => a.push(format!("--nodes={n}-{m}")),
            None => a.push(format!("--nodes={n}")),
        }
    }
    let mut num = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            a.push(format!("--{name}={v}"));
        }
    };
    num("ntasks", req.num_tasks.map(Into::into));
    num("ntasks-per-node", req.ntasks_per_node.map(Into::into));
    num("cpus-per-task", req.cpus_per_task.map(Into::into));
    num("cpus-per-gpu", req.cpus_per_gpu.map(Into::into));
    let mut mem = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            a.push(format!("--{name}={v}M"));
        }
    };
    mem("mem", req.mem_per_node_mb);
    mem("mem-per-cpu", req.mem_per_cpu_mb);
    mem("mem-per-gpu", req.mem_per_gpu_mb);
    match req.exclusive {
        Some(Exclusive::Node) => a.push("--exclusive".into()),
        Some(Exclusive::User) => a.push("--exclusive=user".into()),
        Some(Exclusive::Mcs) => a.push("--exclusive=mcs".into()),
        None if req.oversubscribe => a.push("--oversubscribe".into()),
        None => {}
    }
    if req.contiguous {
        a.push("--contiguous".into());
    }
    if let Some(c) = &req.constraint {
        a.push(format!("--constraint={c}"));
    }
    if let Some(sig) = req.warn_signal {
        let flags = match (req.warn_resv, req.warn_batch_only) {
            (true, true) => "RB:",
            (true, false) => "R:",
            (false, true) => "B:",
            (false, false) => "",
        };
        match req.warn_time {
            Some(t) => a.push(format!("--signal={flags}{sig}@{t}")),
            None => a.push(format!("--signal={flags}{sig}")),
        }
    }
    if let Some(c) = &req.comment {
        a.push(format!("--comment={c}"));
    }
    // Mail goes from the target only to an explicit --mail-user (else it
    // would reach the target's RunAsUser); the stand-in at the origin
    // mails the submitting user otherwise.
    if let (Some(m), Some(u)) = (&req.mail_type, &req.mail_user) {
        a.push(format!("--mail-type={m}"));
        a.push(format!("--mail-user={u}"));
    }
    if let Some(t) = req.time_limit_min {
        a.push(format!("--time={t}"));
    }
    if let Some(t) = req.time_min {
        a.push(format!("--time-min={t}"));
    }
    match req.requeue {
        Some(true) => a.push("--requeue".into()),
        Some(false) => a.push("--no-requeue".into()),
        None => {}
    }
    if req.no_kill {
        a.push("--no-kill".into());
    }
    a.push(format!("--export={}", export_value(req, extra)));
    a
}

/// The words that start a line sbatch takes options from: `#SBATCH`, its
/// old spelling `#slurm`, and (unless `--ignore-pbs`) `#PBS` and `#BSUB`
/// (Slurm 22.05 `sbatch/opt.c`: a line that begins with one, in the
/// script's leading comments).
pub const DIRECTIVE_WORDS: &[&[u8]] = &[b"#SBATCH", b"#slurm", b"#PBS", b"#BSUB"];

/// The job's script as sbatch at its target must read it: every directive
/// line of the leading comments ([`DIRECTIVE_WORDS`]) commented out with a
/// second `#` (`##SBATCH ...`, which sbatch ignores, as Slurm's own docs
/// suggest for disabling a directive). Directives were read once, by
/// sbatch at the origin: what they asked is in the request, and the target
/// gets exactly the options [`sbatch_options`] carries. Read again there,
/// the origin's own (`--partition`, `--account`, `--qos`, `--array`,
/// `--dependency`, `--hold`, `--begin`, `--wait`, `-M`) would act a second
/// time, at a cluster they do not belong to: an array element would become
/// an array, a dependency would name a job of another cluster.
///
/// Like sbatch, the scan stops at the first line with anything other than
/// blanks before a `#` (a command); later lines, and lines that do not
/// begin with a directive word, are left byte for byte. `None` when there
/// is nothing to change.
pub fn without_directives(script: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut at = 0;
    while at < script.len() {
        let end = script[at..].iter().position(|&b| b == b'\n').map_or(script.len(), |i| at + i + 1);
        let line = &script[at..end];
        if DIRECTIVE_WORDS.iter().any(|w| line.starts_with(w)) {
            let o = out.get_or_insert_with(|| script[..at].to_vec());
            o.push(b'#');
            o.extend_from_slice(line);
        } else {
            let command = line.iter().take_while(|&&b| b != b'#').any(|b| !b.is_ascii_whitespace());
            if command {
                if let Some(o) = &mut out {
                    o.extend_from_slice(&script[at..]);
                }
                return out;
            }
            if let Some(o) = &mut out {
                o.extend_from_slice(line);
            }
        }
        at = end;
    }
    out
}

/// The checkpoint variables a job gets at its target (docs/checkpoints.md):
/// `FLEET_CKPT_URL` (its checkpoint prefix there) and `FLEET_RESUME_FROM`
/// (the checkpoint to restore), from the assignment's `fleet.ckpt` and
/// `fleet.resume_from`. A value that could not travel intact in sbatch's
/// comma-separated `--export` (a comma, quote, backslash, space or control
/// character, or longer than 4096 bytes) is left out.
pub fn checkpoint_env(req: &JobRequest) -> Vec<(&'static str, &str)> {
    let safe = |v: &str| {
        !v.is_empty()
            && v.len() <= 4096
            && v.chars().all(|c| c.is_ascii_graphic() && !matches!(c, ',' | '"' | '\'' | '\\'))
    };
    let mut out = Vec::new();
    if let Some(u) = req.fleet.ckpt.as_deref().filter(|u| safe(u)) {
        out.push(("FLEET_CKPT_URL", u));
    }
    if let Some(u) = req.fleet.resume_from.as_deref().filter(|u| safe(u)) {
        out.push(("FLEET_RESUME_FROM", u));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GpuRequest;

    #[test]
    fn directives_are_commented_out_before_the_first_command_only() {
        let script = b"#!/bin/bash\n#SBATCH --array=0-5%2\n#SBATCH -p gpu --hold\n\n# a comment\n  # indented #SBATCH stays\n#slurm --qos=high\n#PBS -q x\n#BSUB -J y\n#SBATCHX\necho hi # #SBATCH\n#SBATCH --dependency=afterok:1\n";
        let out = without_directives(script).expect("directives to comment out");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "#!/bin/bash\n##SBATCH --array=0-5%2\n##SBATCH -p gpu --hold\n\n# a comment\n  # indented #SBATCH stays\n##slurm --qos=high\n##PBS -q x\n##BSUB -J y\n##SBATCHX\necho hi # #SBATCH\n#SBATCH --dependency=afterok:1\n"
        );
        // Nothing to change: no copy.
        assert_eq!(without_directives(b"#!/bin/sh\necho hi\n#SBATCH -p x\n"), None);
        assert_eq!(without_directives(b""), None);
        // A last line without a newline, and a script of directives only.
        assert_eq!(without_directives(b"#!/bin/sh\n#SBATCH -H").as_deref(), Some(&b"#!/bin/sh\n##SBATCH -H"[..]));
        // Non-UTF-8 bytes pass through.
        assert_eq!(
            without_directives(b"#!/bin/sh\n#SBATCH -J \xff\n\xfe\n").as_deref(),
            Some(&b"#!/bin/sh\n##SBATCH -J \xff\n\xfe\n"[..])
        );
    }

    fn gpu(t: Option<&str>, count: u32, scope: GpuScope) -> GpuRequest {
        GpuRequest { gpu_type: t.map(Into::into), count, scope }
    }

    fn check(req: JobRequest, expected: &[&str]) {
        assert_eq!(sbatch_options(&req), expected, "{req:?}");
    }

    #[test]
    fn options_table() {
        let d = JobRequest::default;
        check(d(), &["--export=ALL"]);
        check(
            JobRequest { gpus: vec![gpu(Some("h100"), 16, GpuScope::Job)], ..d() },
            &["--gpus=h100:16", "--export=ALL"],
        );
        check(JobRequest { gpus: vec![gpu(None, 9, GpuScope::Job)], ..d() }, &["--gpus=9", "--export=ALL"]);
        check(
            JobRequest { gpus: vec![gpu(Some("h100"), 8, GpuScope::Node)], ..d() },
            &["--gres=gpu:h100:8", "--export=ALL"],
        );
        check(
            JobRequest { gpus: vec![gpu(Some("h100"), 2, GpuScope::Task)], num_tasks: Some(8), ..d() },
            &["--gpus-per-task=h100:2", "--ntasks=8", "--export=ALL"],
        );
        check(
            JobRequest { gpus: vec![gpu(None, 1, GpuScope::Socket)], ..d() },
            &["--gpus-per-socket=1", "--export=ALL"],
        );
        check(
            JobRequest {
                gpus: vec![gpu(Some("h100"), 4, GpuScope::Node), gpu(Some("a100"), 2, GpuScope::Node)],
                ..d()
            },
            &["--gres=gpu:h100:4,gpu:a100:2", "--export=ALL"],
        );
        check(
            JobRequest {
                gpus: vec![gpu(Some("h100"), 16, GpuScope::Job)],
                min_nodes: Some(1),
                max_nodes: Some(2),
                ..d()
            },
            &["--gpus=h100:16", "--nodes=1-2", "--export=ALL"],
        );
        check(JobRequest { min_nodes: Some(2), max_nodes: Some(2), ..d() }, &["--nodes=2", "--export=ALL"]);
        check(
            JobRequest {
                num_tasks: Some(16),
                ntasks_per_node: Some(8),
                cpus_per_task: Some(4),
                cpus_per_gpu: Some(2),
                ..d()
            },
            &["--ntasks=16", "--ntasks-per-node=8", "--cpus-per-task=4", "--cpus-per-gpu=2", "--export=ALL"],
        );
        check(JobRequest { mem_per_node_mb: Some(8000), ..d() }, &["--mem=8000M", "--export=ALL"]);
        check(JobRequest { mem_per_node_mb: Some(0), ..d() }, &["--mem=0M", "--export=ALL"]);
        check(JobRequest { mem_per_cpu_mb: Some(2048), ..d() }, &["--mem-per-cpu=2048M", "--export=ALL"]);
        check(JobRequest { mem_per_gpu_mb: Some(40960), ..d() }, &["--mem-per-gpu=40960M", "--export=ALL"]);
        check(JobRequest { exclusive: Some(Exclusive::Node), ..d() }, &["--exclusive", "--export=ALL"]);
        check(JobRequest { exclusive: Some(Exclusive::User), ..d() }, &["--exclusive=user", "--export=ALL"]);
        check(JobRequest { exclusive: Some(Exclusive::Mcs), ..d() }, &["--exclusive=mcs", "--export=ALL"]);
        check(JobRequest { oversubscribe: true, ..d() }, &["--oversubscribe", "--export=ALL"]);
        check(JobRequest { contiguous: true, ..d() }, &["--contiguous", "--export=ALL"]);
        check(JobRequest { constraint: Some("ib&nvlink".into()), ..d() }, &["--constraint=ib&nvlink", "--export=ALL"]);
        check(
            JobRequest { warn_signal: Some(10), warn_time: Some(90), warn_batch_only: true, ..d() },
            &["--signal=B:10@90", "--export=ALL"],
        );
        check(JobRequest { warn_signal: Some(12), warn_time: Some(60), ..d() }, &["--signal=12@60", "--export=ALL"]);
        check(
            JobRequest { warn_signal: Some(12), warn_time: Some(60), warn_resv: true, warn_batch_only: true, ..d() },
            &["--signal=RB:12@60", "--export=ALL"],
        );
        check(
            JobRequest { comment: Some("run 7; lr=0.1".into()), ..d() },
            &["--comment=run 7; lr=0.1", "--export=ALL"],
        );
        check(JobRequest { comment: Some("--wrap=evil".into()), ..d() }, &["--comment=--wrap=evil", "--export=ALL"]);
        check(
            JobRequest { mail_type: Some("BEGIN,END".into()), mail_user: Some("a@b.c".into()), ..d() },
            &["--mail-type=BEGIN,END", "--mail-user=a@b.c", "--export=ALL"],
        );
        check(JobRequest { mail_type: Some("END".into()), ..d() }, &["--export=ALL"]);
        check(
            JobRequest { time_limit_min: Some(90), time_min: Some(30), ..d() },
            &["--time=90", "--time-min=30", "--export=ALL"],
        );
        check(
            JobRequest { requeue: Some(false), no_kill: true, ..d() },
            &["--no-requeue", "--no-kill", "--export=ALL"],
        );
        check(JobRequest { requeue: Some(true), ..d() }, &["--requeue", "--export=ALL"]);
        check(JobRequest { export_env: Some("NONE".into()), ..d() }, &["--export=NONE"]);
        check(JobRequest { export_env: Some("nil".into()), ..d() }, &["--export=NIL"]);
        check(JobRequest { export_env: Some("PATH,FOO=bar".into()), ..d() }, &["--export=PATH,FOO=bar"]);
        // A list's bare names take the values the submitter had (sbatch at
        // home looked them up there): inline where they can travel, else
        // left for the agent to put in sbatch's own environment.
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let listed = JobRequest {
            export_env: Some("PATH,DATA,ODD,GONE,SLURM_X,K=v".into()),
            env: env(&["PATH=/u/bin:/bin", "DATA=/scratch/x y", "ODD=a,b", "SLURM_X=1", "PATHX=no"]),
            ..d()
        };
        check(listed.clone(), &["--export=PATH=/u/bin:/bin,DATA=/scratch/x y,ODD,GONE,SLURM_X,K=v"]);
        assert_eq!(export_lookups(&listed), [("ODD".to_string(), "a,b".to_string())]);
        // Not with ALL: sbatch sends the whole environment there anyway.
        let all = JobRequest { export_env: Some("ALL,PATH".into()), ..listed.clone() };
        check(all.clone(), &["--export=ALL,PATH"]);
        assert_eq!(export_lookups(&all), []);
        check(JobRequest { export_env: Some("ALL,FOO=bar".into()), ..d() }, &["--export=ALL,FOO=bar"]);
        // What is never emitted: paths, name, account, qos, partition, licenses.
        check(
            JobRequest {
                name: Some("n".into()),
                work_dir: Some("/w".into()),
                std_out: Some("/o".into()),
                account: Some("acc".into()),
                qos: Some("high".into()),
                partition: Some("gpu".into()),
                licenses: Some("matlab:1".into()),
                ..d()
            },
            &["--export=ALL"],
        );
    }

    #[test]
    fn fleet_variables_join_the_export_mode() {
        let d = JobRequest::default;
        let x = [("FLEET_JOB_ID", "beta-1"), ("FLEET_ORIGIN", "beta")];
        let e = |export: Option<&str>| export_value(&JobRequest { export_env: export.map(Into::into), ..d() }, &x);
        assert_eq!(e(None), "ALL,FLEET_JOB_ID=beta-1,FLEET_ORIGIN=beta");
        assert_eq!(e(Some("NONE")), "FLEET_JOB_ID=beta-1,FLEET_ORIGIN=beta");
        assert_eq!(e(Some("NIL")), "NIL");
        assert_eq!(e(Some("PATH")), "PATH,FLEET_JOB_ID=beta-1,FLEET_ORIGIN=beta");
        assert_eq!(e(Some("ALL,A=1")), "ALL,A=1,FLEET_JOB_ID=beta-1,FLEET_ORIGIN=beta");
        assert_eq!(
            sbatch_options_with_env(&JobRequest { export_env: Some("NONE".into()), ..d() }, &x)
                .last()
                .map(String::as_str),
            Some("--export=FLEET_JOB_ID=beta-1,FLEET_ORIGIN=beta")
        );
    }

    #[test]
    fn the_proxy_mails_begin_and_time_limit_fractions_to_the_submitting_user_of_a_single_job() {
        let d = JobRequest::default;
        let mail = |t: &str| JobRequest { mail_type: Some(t.into()), ..d() };
        assert_eq!(proxy_mail_args(&mail("BEGIN,END")), " --mail-type=BEGIN");
        let timed =
            JobRequest { time_limit_min: Some(90), ..mail("BEGIN,END,FAIL,TIME_LIMIT,TIME_LIMIT_80,TIME_LIMIT_50") };
        assert_eq!(proxy_mail_args(&timed), " --mail-type=BEGIN,TIME_LIMIT_80,TIME_LIMIT_50 --time-limit-min=90");
        assert_eq!(proxy_mail_bits(&timed), 1 | (1 << 6) | (1 << 7));
        // Without --time they are of the limit its target reports.
        assert_eq!(proxy_mail_args(&mail("TIME_LIMIT_90,END")), " --mail-type=TIME_LIMIT_90");
        assert_eq!(proxy_mail_bits(&mail("TIME_LIMIT_90,END")), 1 << 5);
        assert_eq!(
            proxy_mail_args(&JobRequest { mail_user: Some(String::new()), ..mail("BEGIN") }),
            " --mail-type=BEGIN"
        );
        for r in [
            mail("END,FAIL"),
            JobRequest { mail_user: Some("a@b.c".into()), ..timed.clone() },
            JobRequest { is_array: true, ..timed.clone() },
            mail("TIME_LIMIT_BEGIN"),
            d(),
        ] {
            assert_eq!(proxy_mail_bits(&r), 0, "{:?} {:?} {}", r.mail_type, r.mail_user, r.is_array);
            assert_eq!(proxy_mail_args(&r), "");
        }
        assert_eq!(mail_type_bits("BEGIN, END,NOPE"), 3);
    }

    #[test]
    fn mail_bits() {
        assert_eq!(mail_type_names(0), None);
        assert_eq!(mail_type_names(u16::MAX - 1), None);
        assert_eq!(mail_type_names(0b11).as_deref(), Some("BEGIN,END"));
        assert_eq!(mail_type_names(1 << 5 | 1 << 2).as_deref(), Some("FAIL,TIME_LIMIT_90"));
    }

    #[test]
    fn export_modes() {
        let m = |v: Option<&str>| JobRequest { export_env: v.map(Into::into), ..Default::default() }.export_mode();
        assert_eq!(m(None), ExportMode::All);
        assert_eq!(m(Some("all")), ExportMode::All);
        assert_eq!(m(Some("NONE")), ExportMode::None);
        assert_eq!(m(Some("NIL")), ExportMode::Nil);
        assert_eq!(m(Some("A, B=1")), ExportMode::List { all: false, items: vec!["A".into(), "B=1".into()] });
        assert_eq!(m(Some("ALL,B=1")), ExportMode::List { all: true, items: vec!["B=1".into()] });
    }

    #[test]
    fn checkpoint_variables_travel_only_when_safe() {
        let req = |ckpt: Option<&str>, resume: Option<&str>| JobRequest {
            fleet: crate::FleetOptions {
                ckpt: ckpt.map(Into::into),
                resume_from: resume.map(Into::into),
                ..Default::default()
            },
            ..Default::default()
        };
        type Row<'a> = (Option<&'a str>, Option<&'a str>, &'a [(&'a str, &'a str)]);
        let table: &[Row] = &[
            (None, None, &[]),
            (Some("s3://ckpt-east/fleet/j1"), None, &[("FLEET_CKPT_URL", "s3://ckpt-east/fleet/j1")]),
            (
                Some("s3://b/j"),
                Some("s3://b/j/ckpt-000000000003"),
                &[("FLEET_CKPT_URL", "s3://b/j"), ("FLEET_RESUME_FROM", "s3://b/j/ckpt-000000000003")],
            ),
            (Some("s3://b/a,SLURM_X=1"), Some("s3://b/j/c"), &[("FLEET_RESUME_FROM", "s3://b/j/c")]),
            (Some("s3://b/a b"), Some("s3://b/\"x"), &[]),
            (Some(""), Some("s3://b/\nx"), &[]),
        ];
        for (ckpt, resume, want) in table {
            assert_eq!(checkpoint_env(&req(*ckpt, *resume)), want.to_vec(), "{ckpt:?} {resume:?}");
        }
        // In the --export list, after the job's own mode.
        let r = JobRequest { export_env: Some("NONE".into()), ..req(Some("s3://b/j"), None) };
        let extra = checkpoint_env(&r);
        assert_eq!(export_value(&r, &extra), "FLEET_CKPT_URL=s3://b/j");
    }
}
