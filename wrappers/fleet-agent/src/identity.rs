//! Who a forwarded job runs as at this cluster.
//!
//! By default a job runs as the user of the same name as its submitter at
//! the origin (sites of one organisation share a directory). A site may
//! map names with a file (`JobUserMap=/etc/slurm/fleet-users.map`), and
//! only users of `JobUserGroup` with a uid of at least `MinJobUid` can ever
//! be chosen: the agent's sudo rule (`(%JobUserGroup)`) enforces the same
//! set, so even a compromised agent cannot act as root, as a system user
//! or as itself. A shared `RunAsUser` is an explicit, warned opt-in.
//!
//! Users and groups come from /etc/passwd and /etc/group, never NSS: the
//! agent must not block on a directory service.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The local account a job runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Account to charge at this cluster (`None`: the user's default).
    pub account: Option<String>,
}

/// How submitters map to local users (fleet.conf `JobUserMap`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// The same name as at the origin.
    Same,
    /// A map file: `origin:user local_user [account]` lines, `*` for any
    /// origin; `#` comments. Users not listed are refused.
    File(PathBuf),
    /// Every job as this one user (`RunAsUser`, opt-in).
    Shared(String),
}

/// One rule of a map file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapRule {
    pub origin: String,
    pub user: String,
    pub local: String,
    pub account: Option<String>,
    pub line: usize,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !s.starts_with('-')
}

/// Parses a map file; errors carry `file:line`.
pub fn parse_map(text: &str, file: &str) -> Result<Vec<MapRule>> {
    let mut rules = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = format!("{file}:{}", i + 1);
        let f: Vec<&str> = line.split_whitespace().collect();
        if !(2..=3).contains(&f.len()) {
            bail!("{at}: expected `origin:user local_user [account]`, got {line:?}");
        }
        let Some((origin, user)) = f[0].split_once(':') else {
            bail!("{at}: {:?} is not `origin:user` (use `*:user` for any origin)", f[0]);
        };
        if !(origin == "*" || valid_name(origin)) || !valid_name(user) || !valid_name(f[1]) {
            bail!("{at}: names may hold letters, digits, '_', '-', '.' only");
        }
        let account = f.get(2).map(|a| a.to_string());
        if account.as_deref().is_some_and(|a| !valid_name(a)) {
            bail!("{at}: bad account name {:?}", f[2]);
        }
        rules.push(MapRule { origin: origin.into(), user: user.into(), local: f[1].into(), account, line: i + 1 });
    }
    Ok(rules)
}

/// The system's accounts, read once per decision from files.
pub struct Accounts {
    passwd: String,
    group: String,
}

impl Accounts {
    pub fn read() -> Result<Accounts> {
        Ok(Accounts {
            passwd: std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?,
            group: std::fs::read_to_string("/etc/group").context("reading /etc/group")?,
        })
    }

    #[cfg(test)]
    pub fn from_text(passwd: &str, group: &str) -> Accounts {
        Accounts { passwd: passwd.into(), group: group.into() }
    }

    /// (uid, primary gid) of `name`.
    pub fn user(&self, name: &str) -> Option<(u32, u32)> {
        self.passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
        })
    }

    /// The home directory of `name` (passwd's sixth field), if set.
    pub fn home_of(&self, name: &str) -> Option<std::path::PathBuf> {
        self.passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 5 && f[0] == name && f[5].starts_with('/')).then(|| std::path::PathBuf::from(f[5]))
        })
    }

    /// The name of `uid` (an empty name is no name).
    pub fn name_of(&self, uid: u32) -> Option<String> {
        self.passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && !f[0].is_empty() && f[2].parse::<u32>().ok() == Some(uid)).then(|| f[0].to_string())
        })
    }

    /// Members of `group`: listed ones, then users whose primary group it is.
    pub fn members(&self, group: &str) -> Vec<String> {
        let Some((gid, listed)) = self.group.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == group).then(|| (f[2].parse::<u32>().ok(), f[3].to_string()))
        }) else {
            return Vec::new();
        };
        let mut out: Vec<String> = listed.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
        for l in self.passwd.lines() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() > 3 && gid.is_some() && f[3].parse::<u32>().ok() == gid && !out.iter().any(|m| m == f[0]) {
                out.push(f[0].to_string());
            }
        }
        out
    }

    /// Is `name` (primary gid `gid`) a member of group `group`?
    pub fn in_group(&self, name: &str, gid: u32, group: &str) -> bool {
        self.group.lines().any(|l| {
            let f: Vec<&str> = l.split(':').collect();
            f.len() > 3
                && f[0] == group
                && (f[2].parse::<u32>().ok() == Some(gid) || f[3].split(',').any(|m| m.trim() == name))
        })
    }
}

/// The name of `uid` in /etc/passwd.
pub fn name_of_uid(uid: u32) -> Option<String> {
    Accounts::read().ok()?.name_of(uid)
}

/// The identity policy of this cluster.
#[derive(Clone, Debug)]
pub struct Policy {
    pub mapping: Mapping,
    pub group: String,
    pub min_uid: u32,
    /// The agent's own uid: never a job's.
    pub agent_uid: u32,
}

impl Policy {
    /// Which local user runs a job of `user` from `origin`, or why none may.
    pub fn resolve(
        &self,
        acc: &Accounts,
        origin: &str,
        user: Option<&str>,
        account: Option<&str>,
    ) -> Result<LocalUser> {
        let Some(user) = user.filter(|u| valid_name(u)) else {
            bail!("the job carries no usable user name from {origin}");
        };
        let (local, mapped_account) = match &self.mapping {
            Mapping::Same => (user.to_string(), None),
            Mapping::Shared(name) => (name.clone(), None),
            Mapping::File(path) => {
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("reading JobUserMap {}", path.display()))?;
                let rules = parse_map(&text, &path.display().to_string())?;
                let rule = rules
                    .iter()
                    .find(|r| r.origin == origin && r.user == user)
                    .or_else(|| rules.iter().find(|r| r.origin == "*" && r.user == user));
                match rule {
                    Some(r) => (r.local.clone(), r.account.clone()),
                    None => bail!("user {user} from {origin} is not in JobUserMap {}", path.display()),
                }
            }
        };
        let Some((uid, gid)) = acc.user(&local) else {
            bail!("user {local} (for {user} from {origin}) does not exist here");
        };
        if uid == 0 || uid == self.agent_uid {
            bail!("user {local} is root or the agent's own user: refused");
        }
        if !matches!(self.mapping, Mapping::Shared(_)) {
            if uid < self.min_uid {
                bail!(
                    "user {local} has uid {uid}, below MinJobUid={}: system accounts never run forwarded jobs",
                    self.min_uid
                );
            }
            if !acc.in_group(&local, gid, &self.group) {
                bail!("user {local} is not in JobUserGroup={}", self.group);
            }
        }
        let account = mapped_account.or_else(|| account.map(str::to_string)).filter(|a| valid_name(a));
        Ok(LocalUser { name: local, uid, gid, account })
    }
}

impl Policy {
    /// The submitters this cluster would run jobs for, as `origin:user`
    /// pairs (`*` for any origin, `*:*` for a shared user), published in
    /// heartbeats so that an origin refuses at sbatch a job whose user has
    /// no identity anywhere it could go. Each entry is checked as a job
    /// would be (exists, group, uid): a map line naming a missing or
    /// system user is left out. A map file that cannot be read admits no
    /// one (jobs would fail here too); the error is returned for the log.
    pub fn admitted(&self, acc: &Accounts) -> (Vec<String>, Option<String>) {
        match &self.mapping {
            Mapping::Shared(_) => {
                let ok = self.resolve(acc, "*", Some("any"), None).is_ok();
                (if ok { vec!["*:*".to_string()] } else { Vec::new() }, None)
            }
            Mapping::Same => {
                let mut users: Vec<String> = acc
                    .members(&self.group)
                    .into_iter()
                    .filter(|m| self.resolve(acc, "*", Some(m), None).is_ok())
                    .map(|m| format!("*:{m}"))
                    .collect();
                users.sort();
                (users, None)
            }
            Mapping::File(path) => {
                let rules = std::fs::read_to_string(path)
                    .with_context(|| format!("reading JobUserMap {}", path.display()))
                    .and_then(|t| parse_map(&t, &path.display().to_string()));
                match rules {
                    Ok(rules) => {
                        let users = rules
                            .iter()
                            .filter(|r| self.resolve(acc, &r.origin, Some(&r.user), None).is_ok())
                            .map(|r| format!("{}:{}", r.origin, r.user))
                            .collect();
                        (users, None)
                    }
                    Err(e) => (Vec::new(), Some(format!("{e:#}"))),
                }
            }
        }
    }
}

/// Path helper for messages.
pub fn describe(m: &Mapping) -> String {
    match m {
        Mapping::Same => "JobUserMap=same".into(),
        Mapping::File(p) => format!("JobUserMap={}", p.display()),
        Mapping::Shared(u) => format!("RunAsUser={u}"),
    }
}

/// `Mapping` from the fleet.conf value.
pub fn mapping_from(job_user_map: Option<&str>, run_as: Option<&str>) -> Mapping {
    match (run_as, job_user_map) {
        (Some(u), _) => Mapping::Shared(u.to_string()),
        (None, None) | (None, Some("same")) => Mapping::Same,
        (None, Some(p)) => Mapping::File(Path::new(p).to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\nfleet:x:998:998::/:/bin/false\nalice:x:1001:1001::/home/alice:/bin/sh\nbob:x:1002:1002::/home/bob:/bin/sh\ndaemon:x:1:1::/:/bin/false\nmallory:x:1003:1003::/:/bin/sh\nsvc:x:500:500::/:/bin/sh\n";
    const GROUP: &str = "fleetusers:x:2000:alice,bob,svc,root\nalice:x:1001:\n";

    fn policy(m: Mapping) -> Policy {
        Policy { mapping: m, group: "fleetusers".into(), min_uid: 1000, agent_uid: 998 }
    }

    #[test]
    fn same_name_by_default_within_the_group() {
        let acc = Accounts::from_text(PASSWD, GROUP);
        let p = policy(Mapping::Same);
        let u = p.resolve(&acc, "beta", Some("alice"), Some("lab")).unwrap();
        assert_eq!(u, LocalUser { name: "alice".into(), uid: 1001, gid: 1001, account: Some("lab".into()) });
        for (user, why) in [
            (Some("root"), "root"),
            (Some("fleet"), "agent's own"),
            (Some("svc"), "below MinJobUid"),
            (Some("mallory"), "not in JobUserGroup"),
            (Some("nobody"), "does not exist"),
            (None, "no usable user"),
            (Some("a b"), "no usable user"),
            (Some("-rf"), "no usable user"),
        ] {
            let e = p.resolve(&acc, "beta", user, None).unwrap_err().to_string();
            assert!(e.contains(why), "{user:?}: {e}");
        }
    }

    #[test]
    fn homes() {
        let acc = Accounts::from_text(PASSWD, GROUP);
        assert_eq!(acc.home_of("alice").as_deref(), Some(Path::new("/home/alice")));
        assert_eq!(acc.home_of("fleet").as_deref(), Some(Path::new("/")));
        assert_eq!(acc.home_of("nobody"), None);
        assert_eq!(Accounts::from_text("x:x:1:1::rel:/bin/sh\n", "").home_of("x"), None);
    }

    #[test]
    fn names_of_uids() {
        assert_eq!(name_of_uid(0).as_deref(), Some("root"));
        assert_eq!(name_of_uid(4_000_000_000), None);
        let acc = Accounts::from_text(":x:5:5::/:/bin/sh\nann:x:1000:1000::/h:/bin/sh\nbad\n", "");
        assert_eq!(acc.name_of(1000).as_deref(), Some("ann"));
        assert_eq!(acc.name_of(5), None, "an empty name is no name");
        assert_eq!(acc.name_of(7), None);
    }

    #[test]
    fn map_files() {
        let rules = parse_map("# comment\nbeta:al alice lab\n*:bob bob\n\n", "m").unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].account.as_deref(), Some("lab"));
        for (bad, want) in [
            ("alice", "m:1: expected"),
            ("beta alice", "not `origin:user`"),
            ("beta:x y;rm z", "names may hold"),
            ("b:x y z w", "expected"),
        ] {
            let e = parse_map(bad, "m").unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("map");
        std::fs::write(&f, "beta:al alice proj1\n*:bob bob\n").unwrap();
        let acc = Accounts::from_text(PASSWD, GROUP);
        let p = policy(Mapping::File(f));
        let u = p.resolve(&acc, "beta", Some("al"), Some("other")).unwrap();
        assert_eq!((u.name.as_str(), u.account.as_deref()), ("alice", Some("proj1")));
        assert_eq!(p.resolve(&acc, "gamma", Some("bob"), None).unwrap().name, "bob");
        let e = p.resolve(&acc, "gamma", Some("al"), None).unwrap_err().to_string();
        assert!(e.contains("not in JobUserMap"), "{e}");
    }

    #[test]
    fn admitted_users_are_those_a_job_could_run_as() {
        let acc = Accounts::from_text(PASSWD, GROUP);
        // root, svc (uid 500) are in the group but could never run a job.
        assert_eq!(policy(Mapping::Same).admitted(&acc), (vec!["*:alice".into(), "*:bob".into()], None));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("map");
        std::fs::write(&f, "beta:al alice proj1\n*:bob bob\nbeta:m mallory\nbeta:r root\n").unwrap();
        assert_eq!(policy(Mapping::File(f.clone())).admitted(&acc), (vec!["beta:al".into(), "*:bob".into()], None));
        std::fs::write(&f, "not a map\n").unwrap();
        let (users, err) = policy(Mapping::File(f)).admitted(&acc);
        assert!(users.is_empty());
        assert!(err.is_some_and(|e| e.contains("map:1")));
        assert_eq!(policy(Mapping::Shared("svc".into())).admitted(&acc).0, vec!["*:*".to_string()]);
        assert!(policy(Mapping::Shared("root".into())).admitted(&acc).0.is_empty());
    }

    #[test]
    fn shared_user_is_an_opt_in_that_still_refuses_root() {
        let acc = Accounts::from_text(PASSWD, GROUP);
        let p = policy(Mapping::Shared("svc".into()));
        assert_eq!(p.resolve(&acc, "beta", Some("alice"), None).unwrap().name, "svc");
        let p = policy(Mapping::Shared("root".into()));
        assert!(p.resolve(&acc, "beta", Some("alice"), None).is_err());
    }
}
