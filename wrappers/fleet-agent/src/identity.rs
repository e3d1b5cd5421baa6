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
//! Users and groups come through NSS ([`crate::nss`]), as slurmctld,
//! slurmd and sudo see them, so that researchers who exist only in the
//! site's directory (LDAP/sssd) are served; the heartbeat's list of
//! admitted users is cached and computed again only when the local files
//! change or [`NSS_REFRESH`] has passed.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The local account a job runs under.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Account to charge at this cluster (`None`: the user's default).
    pub account: Option<String>,
    /// The account `JobUserMap` gives (not the job's own `-A`, which the
    /// user typed): what may choose a Kubernetes namespace.
    pub mapped_account: Option<String>,
    /// The user's home here (passwd's sixth field), read with the rest of
    /// the account so that submitting needs no second look at /etc/passwd.
    pub home: Option<PathBuf>,
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

/// The system's accounts: through NSS (as slurmctld, slurmd and sudo see
/// them: local files and the site's directory), or, for tests and sites
/// that ask for it, from the two files alone.
pub enum Accounts {
    /// getpwnam_r, getgrnam_r, getgrouplist ([`crate::nss`]).
    Nss,
    /// The text of a passwd and a group file, read once per decision.
    Files { passwd: String, group: String },
}

/// Where the local account files live.
pub const PASSWD: &str = "/etc/passwd";
pub const GROUP: &str = "/etc/group";

/// At most this many entries are walked to find the users whose primary
/// group is `JobUserGroup` (local files, or a directory that enumerates).
const ENUM_LIMIT: usize = 200_000;

fn passwd_fields(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines().map(|l| l.split(':').collect::<Vec<&str>>())
}

impl Accounts {
    /// The accounts as the rest of the system sees them (NSS).
    pub fn read() -> Result<Accounts> {
        Ok(Accounts::Nss)
    }

    pub fn read_from(passwd: &Path, group: &Path) -> Result<Accounts> {
        Ok(Accounts::Files {
            passwd: std::fs::read_to_string(passwd).with_context(|| format!("reading {}", passwd.display()))?,
            group: std::fs::read_to_string(group).with_context(|| format!("reading {}", group.display()))?,
        })
    }

    #[cfg(test)]
    pub fn from_text(passwd: &str, group: &str) -> Accounts {
        Accounts::Files { passwd: passwd.into(), group: group.into() }
    }

    /// (uid, primary gid) of `name`.
    pub fn user(&self, name: &str) -> Option<(u32, u32)> {
        match self {
            Accounts::Nss => crate::nss::user_by_name(name).map(|p| (p.uid, p.gid)),
            Accounts::Files { passwd, .. } => passwd_fields(passwd)
                .find_map(|f| (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?),
        }
    }

    /// The home directory of `name` (passwd's sixth field), if set.
    pub fn home_of(&self, name: &str) -> Option<std::path::PathBuf> {
        match self {
            Accounts::Nss => crate::nss::user_by_name(name)?.home,
            Accounts::Files { passwd, .. } => passwd_fields(passwd).find_map(|f| {
                (f.len() > 5 && f[0] == name && f[5].starts_with('/')).then(|| std::path::PathBuf::from(f[5]))
            }),
        }
    }

    /// The name of `uid` (an empty name is no name).
    pub fn name_of(&self, uid: u32) -> Option<String> {
        match self {
            Accounts::Nss => crate::nss::user_by_uid(uid).map(|p| p.name),
            Accounts::Files { passwd, .. } => passwd_fields(passwd).find_map(|f| {
                (f.len() > 3 && !f[0].is_empty() && f[2].parse::<u32>().ok() == Some(uid)).then(|| f[0].to_string())
            }),
        }
    }

    /// Members of `group`: listed ones, then users whose primary group it
    /// is (through NSS: those its sources enumerate).
    pub fn members(&self, group: &str) -> Vec<String> {
        let (mut out, primaries) = match self {
            Accounts::Nss => {
                let Some(g) = crate::nss::group_by_name(group) else { return Vec::new() };
                (g.members, crate::nss::users_with_primary_gid(g.gid, ENUM_LIMIT))
            }
            Accounts::Files { passwd, group: groups } => {
                let Some((gid, listed)) = passwd_fields(groups)
                    .find_map(|f| (f.len() > 3 && f[0] == group).then(|| (f[2].parse::<u32>().ok(), f[3].to_string())))
                else {
                    return Vec::new();
                };
                let listed = listed.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
                let primaries = passwd_fields(passwd)
                    .filter(|f| f.len() > 3 && gid.is_some() && f[3].parse::<u32>().ok() == gid)
                    .map(|f| f[0].to_string())
                    .collect();
                (listed, primaries)
            }
        };
        for p in primaries {
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out
    }

    /// The gids of the groups `name` is a listed member of, and its primary
    /// group `gid` (sorted, once each): what `initgroups` gives the user.
    pub fn groups_of(&self, name: &str, gid: u32) -> Vec<u32> {
        let mut out = match self {
            Accounts::Nss => crate::nss::group_list(name, gid),
            Accounts::Files { group, .. } => {
                let mut out = vec![gid];
                out.extend(
                    passwd_fields(group)
                        .filter(|f| f.len() > 3 && f[3].split(',').any(|m| m.trim() == name))
                        .filter_map(|f| f[2].parse::<u32>().ok()),
                );
                out
            }
        };
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Is `name` (primary gid `gid`) a member of group `group`?
    pub fn in_group(&self, name: &str, gid: u32, group: &str) -> bool {
        match self {
            Accounts::Nss => crate::nss::group_by_name(group)
                .is_some_and(|g| g.gid == gid || crate::nss::group_list(name, gid).contains(&g.gid)),
            Accounts::Files { group: groups, .. } => passwd_fields(groups).any(|f| {
                f.len() > 3
                    && f[0] == group
                    && (f[2].parse::<u32>().ok() == Some(gid) || f[3].split(',').any(|m| m.trim() == name))
            }),
        }
    }
}

/// The name of `uid` (NSS).
pub fn name_of_uid(uid: u32) -> Option<String> {
    Accounts::read().ok()?.name_of(uid)
}

/// The identity policy of this cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
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
        let mapped_account = mapped_account.filter(|a| valid_name(a));
        let account = mapped_account.clone().or_else(|| account.map(str::to_string)).filter(|a| valid_name(a));
        let home = acc.home_of(&local);
        Ok(LocalUser { name: local, uid, gid, account, mapped_account, home })
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
        let (users, _, err) = self.admitted_with_accounts(acc);
        (users, err)
    }

    /// [`Policy::admitted`], and in the same pass those of its pairs whose
    /// map line names an account, with it: where a backend that places
    /// jobs by account (a Kubernetes namespace per account) sends them.
    pub fn admitted_with_accounts(&self, acc: &Accounts) -> (Vec<String>, Vec<(String, String)>, Option<String>) {
        match &self.mapping {
            Mapping::Shared(_) => {
                let ok = self.resolve(acc, "*", Some("any"), None).is_ok();
                (if ok { vec!["*:*".to_string()] } else { Vec::new() }, Vec::new(), None)
            }
            Mapping::Same => {
                let mut users: Vec<String> = acc
                    .members(&self.group)
                    .into_iter()
                    .filter(|m| self.resolve(acc, "*", Some(m), None).is_ok())
                    .map(|m| format!("*:{m}"))
                    .collect();
                users.sort();
                (users, Vec::new(), None)
            }
            Mapping::File(path) => {
                let rules = std::fs::read_to_string(path)
                    .with_context(|| format!("reading JobUserMap {}", path.display()))
                    .and_then(|t| parse_map(&t, &path.display().to_string()));
                match rules {
                    Ok(rules) => {
                        let (mut users, mut accounts) = (Vec::new(), Vec::new());
                        for r in rules.iter().filter(|r| self.resolve(acc, &r.origin, Some(&r.user), None).is_ok()) {
                            let pair = format!("{}:{}", r.origin, r.user);
                            if let Some(a) = r.account.as_ref().filter(|a| valid_name(a)) {
                                accounts.push((pair.clone(), a.clone()));
                            }
                            users.push(pair);
                        }
                        (users, accounts, None)
                    }
                    Err(e) => (Vec::new(), Vec::new(), Some(format!("{e:#}"))),
                }
            }
        }
    }
}

/// One file's identity and version: a rewrite in place changes the mtime
/// (nanoseconds) or the length, a replacement by rename the inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: Option<std::time::SystemTime>,
}

/// `path`'s [`Stamp`] now; `None` when it cannot be read.
pub fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp { dev: m.dev(), ino: m.ino(), len: m.len(), mtime: m.modified().ok() })
}

/// The users a heartbeat publishes (`Policy::admitted`), computed again
/// only when /etc/passwd, /etc/group, the map file or the policy changed:
/// a heartbeat every second must not read three files every second, nor
/// log the same complaint about a bad map file every second.
pub struct AdmittedCache {
    passwd: PathBuf,
    group: PathBuf,
    /// Through NSS (the agent) or from the two files alone (tests).
    nss: bool,
    key: Option<(Policy, Vec<Option<Stamp>>)>,
    /// When the list was last computed (NSS: a directory changes without
    /// touching any local file, so the list is computed again after
    /// [`NSS_REFRESH`]).
    at: Option<std::time::Instant>,
    users: Option<Vec<String>>,
    accounts: Vec<(String, String)>,
    error: Option<String>,
    /// How often the accounts were read (for tests and the curious).
    pub reads: u64,
}

/// How long a list of admitted users computed through NSS is published
/// before it is computed again (a user added to the directory is served
/// by the origin's sbatch check after at most this long).
pub const NSS_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// One look at the cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Admitted {
    /// `None`: the accounts could not be read (nothing is published).
    pub users: Option<Vec<String>>,
    /// Those of `users` whose map line names an account, with it
    /// ([`Policy::admitted_with_accounts`]).
    pub accounts: Vec<(String, String)>,
    /// A problem not reported before (the same one is returned once, until
    /// the files change and it is gone or another takes its place).
    pub new_error: Option<String>,
}

impl Default for AdmittedCache {
    /// The agent's: through NSS, computed again when /etc/passwd,
    /// /etc/group or the map file change, or after [`NSS_REFRESH`].
    fn default() -> Self {
        AdmittedCache { nss: true, ..Self::with_files(Path::new(PASSWD), Path::new(GROUP)) }
    }
}

impl AdmittedCache {
    /// From these two files alone, computed again only when they change.
    pub fn with_files(passwd: &Path, group: &Path) -> Self {
        AdmittedCache {
            passwd: passwd.to_path_buf(),
            group: group.to_path_buf(),
            nss: false,
            key: None,
            at: None,
            users: None,
            accounts: Vec::new(),
            error: None,
            reads: 0,
        }
    }

    pub fn get(&mut self, policy: &Policy) -> Admitted {
        let mut files = vec![stamp(&self.passwd), stamp(&self.group)];
        if let Mapping::File(p) = &policy.mapping {
            files.push(stamp(p));
        }
        let key = (policy.clone(), files);
        let fresh = !self.nss || self.at.is_some_and(|t| t.elapsed() < NSS_REFRESH);
        if self.key.as_ref() == Some(&key) && fresh {
            return Admitted { users: self.users.clone(), accounts: self.accounts.clone(), new_error: None };
        }
        self.reads += 1;
        let acc = if self.nss { Accounts::read() } else { Accounts::read_from(&self.passwd, &self.group) };
        let (users, accounts, error) = match acc {
            Ok(acc) => {
                let (users, accounts, err) = policy.admitted_with_accounts(&acc);
                (Some(users), accounts, err.map(|e| format!("no forwarded job can run here: {e}")))
            }
            Err(e) => (None, Vec::new(), Some(format!("reading the accounts to publish: {e:#}"))),
        };
        let new_error = error.clone().filter(|e| self.error.as_ref() != Some(e));
        self.key = Some(key);
        self.at = Some(std::time::Instant::now());
        self.users = users.clone();
        self.accounts = accounts.clone();
        self.error = error;
        Admitted { users, accounts, new_error }
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
        assert_eq!(
            u,
            LocalUser {
                name: "alice".into(),
                uid: 1001,
                gid: 1001,
                account: Some("lab".into()),
                mapped_account: None,
                home: Some("/home/alice".into())
            }
        );
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
    fn groups_are_the_primary_and_the_listed_ones() {
        let acc = Accounts::from_text(
            PASSWD,
            "fleetusers:x:2000:alice,bob\nalice:x:1001:\nlab:x:3000:bob, alice\nx:y\nbad:x:zz:alice\n",
        );
        assert_eq!(acc.groups_of("alice", 1001), vec![1001, 2000, 3000]);
        assert_eq!(acc.groups_of("bob", 1002), vec![1002, 2000, 3000]);
        assert_eq!(acc.groups_of("mallory", 1003), vec![1003]);
        // A name that is a prefix of a member's is not a member.
        assert_eq!(acc.groups_of("ali", 1009), vec![1009]);
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
        assert_eq!(
            (u.name.as_str(), u.account.as_deref(), u.mapped_account.as_deref()),
            ("alice", Some("proj1"), Some("proj1"))
        );
        // A map line without an account: the job's -A is charged, and is no mapped account.
        let u = p.resolve(&acc, "gamma", Some("bob"), Some("vision")).unwrap();
        assert_eq!((u.account.as_deref(), u.mapped_account), (Some("vision"), None));
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
        // Those with an account on their line, with it (bob's has none).
        assert_eq!(
            policy(Mapping::File(f.clone())).admitted_with_accounts(&acc).1,
            [("beta:al".into(), "proj1".into())]
        );
        assert!(policy(Mapping::Same).admitted_with_accounts(&acc).1.is_empty());
        std::fs::write(&f, "not a map\n").unwrap();
        let (users, err) = policy(Mapping::File(f)).admitted(&acc);
        assert!(users.is_empty());
        assert!(err.is_some_and(|e| e.contains("map:1")));
        assert_eq!(policy(Mapping::Shared("svc".into())).admitted(&acc).0, vec!["*:*".to_string()]);
        assert!(policy(Mapping::Shared("root".into())).admitted(&acc).0.is_empty());
    }

    #[test]
    fn admitted_users_are_read_again_only_when_a_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (passwd, group, map) = (dir.path().join("passwd"), dir.path().join("group"), dir.path().join("map"));
        std::fs::write(&passwd, PASSWD).unwrap();
        std::fs::write(&group, GROUP).unwrap();
        std::fs::write(&map, "beta:al alice\n").unwrap();
        let mut cache = AdmittedCache::with_files(&passwd, &group);
        let p = policy(Mapping::File(map.clone()));
        let want = Admitted { users: Some(vec!["beta:al".into()]), ..Default::default() };
        assert_eq!(cache.get(&p), want);
        assert_eq!(cache.get(&p), want);
        assert_eq!(cache.reads, 1, "unchanged files are not read again");

        // A bad map file: warned about once, not on every heartbeat.
        std::fs::write(&map, "not a map at all\n").unwrap();
        let first = cache.get(&p);
        assert_eq!(first.users, Some(vec![]));
        assert!(first.new_error.as_deref().is_some_and(|e| e.contains("map:1")), "{first:?}");
        assert_eq!(cache.get(&p), Admitted { users: Some(vec![]), ..Default::default() });
        assert_eq!(cache.reads, 2);
        // Touched but still the same problem: read again, still no new warning.
        std::fs::write(&map, "not a map at all \n").unwrap();
        assert_eq!(cache.get(&p).new_error, None);
        assert_eq!(cache.reads, 3);
        // Mended, then broken again: a warning again.
        std::fs::write(&map, "*:bob bob\n").unwrap();
        assert_eq!(cache.get(&p), Admitted { users: Some(vec!["*:bob".into()]), ..Default::default() });
        std::fs::write(&map, "x\n").unwrap();
        assert!(cache.get(&p).new_error.is_some());

        // A new member in /etc/group (replaced by rename, as vigr/usermod do).
        let p = policy(Mapping::Same);
        assert_eq!(cache.get(&p).users, Some(vec!["*:alice".into(), "*:bob".into()]));
        let n = cache.reads;
        std::fs::write(dir.path().join("passwd.new"), format!("{PASSWD}carl:x:1005:1005::/home/carl:/bin/sh\n"))
            .unwrap();
        std::fs::rename(dir.path().join("passwd.new"), &passwd).unwrap();
        std::fs::write(dir.path().join("group.new"), GROUP.replace("alice,bob", "alice,bob,carl")).unwrap();
        std::fs::rename(dir.path().join("group.new"), &group).unwrap();
        assert_eq!(cache.get(&p).users, Some(vec!["*:alice".into(), "*:bob".into(), "*:carl".into()]));
        assert_eq!(cache.reads, n + 1);
        // A changed policy (a reloaded fleet.conf) is computed afresh.
        let stricter = Policy { min_uid: 1002, ..p };
        assert_eq!(cache.get(&stricter).users, Some(vec!["*:bob".into(), "*:carl".into()]));

        // Accounts unreadable: nothing published, said once.
        std::fs::remove_file(&group).unwrap();
        let gone = cache.get(&stricter);
        assert_eq!(gone.users, None);
        assert!(gone.new_error.is_some_and(|e| e.contains("group")));
        assert_eq!(cache.get(&stricter), Admitted::default());
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
