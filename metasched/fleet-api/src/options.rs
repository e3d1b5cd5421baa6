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
    ("fleet-image", "image", "Fleet: container image the job runs in at a Kubernetes target (default: the site's KubeImage)"),
];

/// Longest image reference accepted (Docker's limit on a repository name is 255).
pub const MAX_IMAGE_LEN: usize = 255;

/// Why `s` is not a container image reference (`[registry[:port]/]path[:tag][@algo:hex]`,
/// the grammar of the OCI distribution reference), or `Ok`.
pub fn check_image(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("empty image reference".into());
    }
    if s.len() > MAX_IMAGE_LEN {
        return Err(format!("longer than {MAX_IMAGE_LEN} characters"));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_alphanumeric() || "./:-_@".contains(*c))) {
        return Err(format!("{:?} is not allowed in an image reference", c));
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let (algo, hex) = d.split_once(':').ok_or("a digest is <algorithm>:<hex>")?;
        let algo_ok = !algo.is_empty()
            && algo
                .split(['+', '.', '_', '-'])
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        if !algo_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("bad digest {d:?} (e.g. sha256:<64 hex digits>)"));
        }
    }
    // A tag follows the last ':' after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && t.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok {
            return Err(format!("bad tag {t:?}"));
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // The first part is a registry when it looks like a host (a '.' or a
    // port) or is localhost, and more parts follow.
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (h, port) = match host.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !h.split('.').all(label_ok) {
            return Err(format!("bad registry host {h:?}"));
        }
        if port.is_some_and(|p| p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit())) {
            return Err(format!("bad registry port in {host:?}"));
        }
    }
    for p in &parts {
        // path-component: [a-z0-9]+ separated by '.', '_', '__' or '-'s.
        let ok = !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            && p.starts_with(|c: char| c.is_ascii_alphanumeric())
            && p.ends_with(|c: char| c.is_ascii_alphanumeric())
            && !p.contains("..")
            && !p.contains("___")
            && !p.contains("._")
            && !p.contains("_.");
        if !ok {
            return Err(format!("bad repository path component {p:?} (lower-case letters, digits, separators inside)"));
        }
    }
    Ok(())
}

/// A cluster name as `--fleet-to` takes it (and Slurm names clusters).
pub fn valid_cluster_name(s: &str) -> bool {
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
        "fleet-image" => {
            if let Err(why) = check_image(v) {
                return bad(&format!("{why}; expected an image reference such as nvcr.io/nvidia/pytorch:24.05-py3"));
            }
            opts.image = Some(v.to_string());
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
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_image=nvcr.io/nvidia/pytorch:24.05-py3"],
            Ok(FleetOptions { image: Some("nvcr.io/nvidia/pytorch:24.05-py3".into()), ..d() }),
        );
        check(
            &["_SLURM_SPANK_OPTION_fleet_fleet_image=ubuntu;rm -rf /"],
            Err("--fleet-image=ubuntu;rm -rf /: ';' is not allowed in an image reference; expected an image reference such as nvcr.io/nvidia/pytorch:24.05-py3"),
        );
    }

    fn image(s: &str, expected: Result<(), &str>) {
        assert_eq!(check_image(s), expected.map_err(String::from), "{s:?}");
    }

    #[test]
    fn image_references() {
        let sha = "sha256:".to_string() + &"a".repeat(64);
        for ok in [
            "ubuntu",
            "ubuntu:24.04",
            "library/ubuntu:24.04",
            "nvcr.io/nvidia/pytorch:24.05-py3",
            "registry.example.org:5000/team/train_job:v1.2",
            "localhost/img",
            "localhost:5000/a/b-c__d.e",
            &format!("ghcr.io/org/img@{sha}"),
            &format!("ghcr.io/org/img:tag@{sha}"),
        ] {
            image(ok, Ok(()));
        }
        image("", Err("empty image reference"));
        image(&"a".repeat(256), Err("longer than 255 characters"));
        image("ubuntu 24.04", Err("' ' is not allowed in an image reference"));
        image("ubuntu\n", Err("'\\n' is not allowed in an image reference"));
        image("$(id)", Err("'$' is not allowed in an image reference"));
        image("-v", Err("bad repository path component \"-v\" (lower-case letters, digits, separators inside)"));
        image(
            "--privileged",
            Err("bad repository path component \"--privileged\" (lower-case letters, digits, separators inside)"),
        );
        image(
            "Ubuntu",
            Err("bad repository path component \"Ubuntu\" (lower-case letters, digits, separators inside)"),
        );
        image("a/../b", Err("bad repository path component \"..\" (lower-case letters, digits, separators inside)"));
        image("a//b", Err("bad repository path component \"\" (lower-case letters, digits, separators inside)"));
        image("/abs", Err("bad repository path component \"\" (lower-case letters, digits, separators inside)"));
        image("ubuntu:", Err("bad tag \"\""));
        image("ubuntu:.x", Err("bad tag \".x\""));
        image("-bad.io/x", Err("bad registry host \"-bad.io\""));
        image("reg.io:99999x/x", Err("bad registry port in \"reg.io:99999x\""));
        image("ubuntu@sha256:abc", Err("bad digest \"sha256:abc\" (e.g. sha256:<64 hex digits>)"));
        image("ubuntu@md5", Err("a digest is <algorithm>:<hex>"));
    }
}
