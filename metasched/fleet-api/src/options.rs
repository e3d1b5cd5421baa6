//! The `--fleet-*` options: names, and the one validator used both by
//! `spank_fleet.so` (where the user types them) and by `job_submit_fleet.so`
//! (which reads them back from the job's SPANK environment).

use crate::{FleetMode, FleetOptions};

/// Prefix of SPANK option values in a job's `spank_job_env`:
/// `_SLURM_SPANK_OPTION_<plugin>_<option with '-' as '_'>`.
pub const SPANK_ENV_PREFIX: &str = "_SLURM_SPANK_OPTION_fleet_";

/// (option name, argument name or "" for flags, usage text)
pub const OPTIONS: &[(&str, &str, &str)] = &[
    ("fleet", "auto|local|remote", "Fleet placement: auto (default) lets the meta-scheduler choose, local keeps the job at this cluster, remote sends it elsewhere"),
    ("fleet-to", "cluster[,cluster...]", "Fleet: run only on these clusters"),
    ("fleet-max-price", "usd", "Fleet: highest acceptable price in USD per GPU-hour"),
    ("fleet-data", "uri[,uri...]", "Fleet: datasets the job reads (placement prefers clusters near them)"),
    ("fleet-ckpt", "uri", "Fleet: where the job writes checkpoints"),
    ("fleet-interruptible", "", "Fleet: the job tolerates preemption (may run on spot capacity)"),
];

fn valid_cluster_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn valid_uri(s: &str) -> bool {
    !s.is_empty() && s.len() <= 4096 && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// Apply one option (`name` without the leading dashes) to `opts`.
/// The error names the option, the value and what is expected.
pub fn apply(opts: &mut FleetOptions, name: &str, value: Option<&str>) -> Result<(), String> {
    let v = value.unwrap_or("").trim();
    let bad = |what: &str| Err(format!("--{name}={v}: {what}"));
    match name {
        "fleet" => {
            opts.mode = match v.to_ascii_lowercase().as_str() {
                "auto" => FleetMode::Auto,
                "local" => FleetMode::Local,
                "remote" => FleetMode::Remote,
                _ => return bad("expected auto, local or remote"),
            }
        }
        "fleet-to" => {
            let names: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
            if let Some(n) = names.iter().find(|n| !valid_cluster_name(n)) {
                return bad(&format!("\"{n}\" is not a cluster name (letters, digits, '-', '_')"));
            }
            opts.to = names;
        }
        "fleet-max-price" => match v.parse::<f64>() {
            Ok(p) if p.is_finite() && p > 0.0 && p < 1.0e6 => opts.max_price = Some(p),
            _ => return bad("expected a positive price in USD per GPU-hour, e.g. 2.50"),
        },
        "fleet-data" => {
            let uris: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
            if let Some(u) = uris.iter().find(|u| !valid_uri(u)) {
                return bad(&format!("\"{u}\" is not a URI"));
            }
            opts.data.extend(uris);
        }
        "fleet-ckpt" => {
            if !valid_uri(v) {
                return bad("expected a URI such as s3://bucket/run1/");
            }
            opts.ckpt = Some(v.to_string());
        }
        "fleet-interruptible" => {
            opts.interruptible = match v.to_ascii_lowercase().as_str() {
                "" | "1" | "yes" | "true" => true,
                "0" | "no" | "false" => false,
                _ => return bad("takes no value"),
            }
        }
        _ => return Err(format!("unknown Fleet option --{name}")),
    }
    Ok(())
}

/// Read the options back from `NAME=value` SPANK environment entries.
pub fn from_spank_env<'a>(env: impl IntoIterator<Item = &'a str>) -> Result<FleetOptions, String> {
    let mut opts = FleetOptions::default();
    for entry in env {
        let Some(rest) = entry.strip_prefix(SPANK_ENV_PREFIX) else {
            continue;
        };
        let (key, value) = rest.split_once('=').unwrap_or((rest, ""));
        let name = key.replace('_', "-");
        // A flag (no argument) reaches the job's SPANK environment as the
        // text "(null)": Slurm formats the NULL optarg with "%s". Only
        // flags can carry it (an option with an argument always has one).
        let is_flag = OPTIONS.iter().any(|(n, arg, _)| *n == name && arg.is_empty());
        let value = if is_flag && value == "(null)" { "" } else { value };
        apply(&mut opts, &name, Some(value))?;
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(env: &[&str], expected: Result<FleetOptions, &str>) {
        let got = from_spank_env(env.iter().copied());
        match expected {
            Ok(o) => assert_eq!(got, Ok(o), "{env:?}"),
            Err(msg) => assert_eq!(got.unwrap_err(), msg, "{env:?}"),
        }
    }

    #[test]
    fn table() {
        let d = FleetOptions::default;
        check(&[], Ok(d()));
        check(&["OTHER=1", "_SLURM_SPANK_OPTION_pyxis_image=x"], Ok(d()));
        check(&["_SLURM_SPANK_OPTION_fleet_fleet=local"], Ok(FleetOptions { mode: FleetMode::Local, ..d() }));
        check(&["_SLURM_SPANK_OPTION_fleet_fleet=REMOTE"], Ok(FleetOptions { mode: FleetMode::Remote, ..d() }));
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_to=alpha, beta"],
            Ok(FleetOptions { to: vec!["alpha".into(), "beta".into()], ..d() }),
        );
        check(&["_SLURM_SPANK_OPTION_fleet_fleet_max_price=2.5"], Ok(FleetOptions { max_price: Some(2.5), ..d() }));
        check(&["_SLURM_SPANK_OPTION_fleet_fleet_interruptible="], Ok(FleetOptions { interruptible: true, ..d() }));
        // What slurmctld really hands job_submit for the flag (option or #SBATCH).
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_interruptible=(null)"],
            Ok(FleetOptions { interruptible: true, ..d() }),
        );
        check(&["_SLURM_SPANK_OPTION_fleet_fleet_interruptible=no"], Ok(d()));
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_interruptible=maybe"],
            Err("--fleet-interruptible=maybe: takes no value"),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_data=s3://a/b,gs://c", "_SLURM_SPANK_OPTION_fleet_fleet_ckpt=s3://ck/"],
            Ok(FleetOptions { data: vec!["s3://a/b".into(), "gs://c".into()], ckpt: Some("s3://ck/".into()), ..d() }),
        );
        check(&["_SLURM_SPANK_OPTION_fleet_fleet=bogus"], Err("--fleet=bogus: expected auto, local or remote"));
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_to=a;b"],
            Err("--fleet-to=a;b: \"a;b\" is not a cluster name (letters, digits, '-', '_')"),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_to="],
            Err("--fleet-to=: \"\" is not a cluster name (letters, digits, '-', '_')"),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_max_price=-1"],
            Err("--fleet-max-price=-1: expected a positive price in USD per GPU-hour, e.g. 2.50"),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_max_price=NaN"],
            Err("--fleet-max-price=NaN: expected a positive price in USD per GPU-hour, e.g. 2.50"),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_ckpt=a b"],
            Err("--fleet-ckpt=a b: expected a URI such as s3://bucket/run1/"),
        );
        check(&["_SLURM_SPANK_OPTION_fleet_fleet_bogus=1"], Err("unknown Fleet option --fleet-bogus"));
    }
}
