//! `spank_fleet.so`: the `--fleet-*` options of sbatch (and salloc/srun),
//! listed by `sbatch --help` under "Options provided by plugins".
//!
//! Values are checked where the user types them, with the same validator
//! job_submit_fleet applies when it reads them back from the job's SPANK
//! environment (`_SLURM_SPANK_OPTION_fleet_<option>`), so a bad value
//! fails the command with a message naming the option and what it expects.

use slurm::spank::OptSpec;

const fn arg(s: &'static str) -> Option<&'static str> {
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

/// The option table, built from `fleet_api::options::OPTIONS`; `val` is
/// the index into that table.
pub static OPTIONS: [OptSpec; 7] = {
    let o = fleet_api::options::OPTIONS;
    [
        OptSpec { name: o[0].0, arginfo: arg(o[0].1), usage: o[0].2, val: 0 },
        OptSpec { name: o[1].0, arginfo: arg(o[1].1), usage: o[1].2, val: 1 },
        OptSpec { name: o[2].0, arginfo: arg(o[2].1), usage: o[2].2, val: 2 },
        OptSpec { name: o[3].0, arginfo: arg(o[3].1), usage: o[3].2, val: 3 },
        OptSpec { name: o[4].0, arginfo: arg(o[4].1), usage: o[4].2, val: 4 },
        OptSpec { name: o[5].0, arginfo: arg(o[5].1), usage: o[5].2, val: 5 },
        OptSpec { name: o[6].0, arginfo: arg(o[6].1), usage: o[6].2, val: 6 },
    ]
};

/// Check one option value. In slurmd (remote) the value was already
/// checked at submission.
pub fn validate(val: i32, arg: Option<&str>, remote: bool) -> Result<(), String> {
    if remote {
        return Ok(());
    }
    let Some((name, _, _)) = usize::try_from(val).ok().and_then(|i| fleet_api::options::OPTIONS.get(i)) else {
        return Err(format!("spank/fleet: unknown option index {val}"));
    };
    let mut scratch = fleet_api::FleetOptions::default();
    fleet_api::options::apply(&mut scratch, name, arg)
}

slurm::spank_plugin!("fleet", &OPTIONS, validate);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_shared_option_list() {
        for (i, o) in OPTIONS.iter().enumerate() {
            assert_eq!(o.val as usize, i);
            assert_eq!(o.name, fleet_api::options::OPTIONS[i].0);
        }
        assert_eq!(OPTIONS[5].arginfo, None, "--fleet-interruptible is a flag");
        assert_eq!(OPTIONS.len(), fleet_api::options::OPTIONS.len(), "every shared option is a SPANK option");
    }

    #[test]
    fn validation() {
        assert_eq!(validate(0, Some("remote"), false), Ok(()));
        assert_eq!(validate(0, Some("x"), false), Err("--fleet=x: expected auto, local or remote".into()));
        assert_eq!(validate(0, Some("x"), true), Ok(()));
        assert_eq!(validate(5, None, false), Ok(()));
        assert!(validate(2, Some("cheap"), false).is_err());
        assert!(validate(99, None, false).is_err());
        assert_eq!(validate(6, Some("nvcr.io/nvidia/pytorch:24.05-py3"), false), Ok(()));
        assert_eq!(
            validate(6, Some("img`id`"), false),
            Err("--fleet-image=img`id`: '`' is not allowed in an image reference; expected an image reference such as nvcr.io/nvidia/pytorch:24.05-py3".into())
        );
    }
}
