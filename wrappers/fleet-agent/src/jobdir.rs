//! Per-job directories at the target, and reading what a job wrote there
//! without ever following what the job controls.
//!
//! `<spool>/jobs/<id>` belongs to the agent, mode 0700, with POSIX ACL
//! entries for the job's user (rwx) and a default ACL that gives the agent
//! read/write on everything the job creates inside. Nobody else — another
//! user's job included — can list, read or write it. The job's working
//! directory, `HOME`, `stdout` and `stderr` live there; the directory is
//! removed once the job's output has been relayed.
//!
//! The job owns the entries of its directory and may replace `stdout` by
//! a symlink, a hard link, a FIFO or a directory at any time. The relay
//! therefore opens with `O_NOFOLLOW | O_NONBLOCK` and accepts only a
//! regular file with one link, owned by the job's user: the agent never
//! reads anything through a job's directory that the job's user could not
//! read itself.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const UNDEFINED: u32 = u32::MAX;

/// The binary form of a POSIX ACL as Linux stores it in the
/// `system.posix_acl_*` extended attributes (version 2, entries sorted by
/// tag then id).
fn acl_xattr(named_users: &[(u32, u16)]) -> Vec<u8> {
    acl_xattr_with(7, named_users)
}

/// [`acl_xattr`] with the owner's permissions `owner` (the mask lets the
/// named users' through).
fn acl_xattr_with(owner: u16, named_users: &[(u32, u16)]) -> Vec<u8> {
    let mut users = named_users.to_vec();
    users.sort_unstable();
    users.dedup_by_key(|u| u.0);
    let mask = users.iter().fold(0, |m, u| m | u.1);
    let mut entries = vec![(ACL_USER_OBJ, owner, UNDEFINED)];
    entries.extend(users.iter().map(|&(uid, perm)| (ACL_USER, perm, uid)));
    entries.push((ACL_GROUP_OBJ, 0, UNDEFINED));
    entries.push((ACL_MASK, if named_users.is_empty() { 7 } else { mask }, UNDEFINED));
    entries.push((ACL_OTHER, 0, UNDEFINED));
    let mut out = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

fn set_xattr(f: &File, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let cname = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: the fd is open for the duration of the call (borrowed from
    // `f`); `cname` is NUL-terminated; `value` is a valid slice of
    // `value.len()` bytes that the kernel only reads.
    let rc = unsafe { libc::fsetxattr(f.as_raw_fd(), cname.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Creates `dir` (which must not exist) for a job of `job_uid`: mode 0700,
/// owned by the agent, ACL rwx for the job's user, default ACL rwx for the
/// agent and the job's user on everything created inside.
pub fn create(dir: &Path, job_uid: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let agent_uid = std::fs::metadata("/proc/self").map(|m| m.uid()).context("reading /proc/self")?;
    std::fs::DirBuilder::new().mode(0o700).create(dir).with_context(|| format!("creating {}", dir.display()))?;
    let f = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let access = acl_xattr(&[(job_uid, 7)]);
    let default = acl_xattr(&[(job_uid, 7), (agent_uid, 7)]);
    set_xattr(&f, "system.posix_acl_access", &access)
        .and_then(|()| set_xattr(&f, "system.posix_acl_default", &default))
        .with_context(|| {
            format!("setting the ACL of {} (the spool's filesystem must support POSIX ACLs)", dir.display())
        })?;
    Ok(())
}

/// Gives `uid` what it needs of a tree the agent just created for that
/// user's job (a checkpoint it copied into a `file://` store): every
/// directory rwx for `uid` (and by default ACL for what is created inside:
/// `uid` and the agent), every file readable; nobody else anything. Opened
/// without following links; other entries are left alone. The number of
/// entries given.
pub fn grant_tree(top: &Path, uid: u32) -> Result<usize> {
    let agent_uid = std::fs::metadata("/proc/self").map(|m| m.uid()).context("reading /proc/self")?;
    let mut given = 0;
    let mut dirs = vec![top.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&dir)
            .with_context(|| format!("opening {}", dir.display()))?;
        set_xattr(&f, "system.posix_acl_access", &acl_xattr(&[(uid, 7)]))
            .and_then(|()| set_xattr(&f, "system.posix_acl_default", &acl_xattr(&[(uid, 7), (agent_uid, 7)])))
            .with_context(|| {
                format!("setting the ACL of {} (its filesystem must support POSIX ACLs)", dir.display())
            })?;
        given += 1;
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e?;
            let kind = e.file_type()?;
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() {
                let path = e.path();
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                set_xattr(&f, "system.posix_acl_access", &acl_xattr_with(6, &[(uid, 4)]))
                    .with_context(|| format!("setting the ACL of {}", path.display()))?;
                given += 1;
            }
        }
    }
    Ok(given)
}

/// Lets `reader` read the file `f` (the agent's own, mode 0600) through a
/// named ACL entry; nobody else gets anything. Root and the file's owner
/// need no entry.
pub fn give_reader(f: &File, reader: u32) -> std::io::Result<()> {
    let owner = f.metadata()?.uid();
    if reader == 0 || reader == owner {
        return Ok(());
    }
    set_xattr(f, "system.posix_acl_access", &acl_xattr_with(6, &[(reader, 4)]))
}

/// Replace `dir/name` with `bytes` as one step (a temporary file renamed
/// over it): a reader sees the old file or the new one, never a part. The
/// file is the agent's (mode 0600) and readable by `reader` too (SlurmUser,
/// whose slurmctld loads the plugin) through a named ACL entry: what the
/// agent keeps or publishes there names other users (the view's admitted
/// users and quotas, the stand-ins' job ids, a job's owner), which
/// `PrivateData=users,jobs` hides from them.
pub fn replace_private(dir: &Path, name: &str, bytes: &[u8], reader: Option<u32>) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!(".{name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = create_new(&tmp, 0o600)?;
    if let Some(uid) = reader {
        give_reader(&f, uid)
            .map_err(|e| std::io::Error::new(e.kind(), format!("letting uid {uid} read {}: {e}", tmp.display())))?;
    }
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))
}

/// Makes `dir` (and what is missing above it) a directory of the agent's
/// alone, mode 0700, also when it exists with another mode (an older
/// agent's).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// The named users of `path`'s ACL `name` (`system.posix_acl_access` or
/// `_default`) with their permissions (tests).
#[cfg(test)]
pub(crate) fn named_acl(path: &Path, name: &str) -> Vec<(u32, u16)> {
    let (cpath, cname) =
        (std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap(), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 512];
    // SAFETY: both strings are NUL-terminated; the kernel writes at most
    // `buf.len()` bytes into `buf`.
    let n = unsafe { libc::lgetxattr(cpath.as_ptr(), cname.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = usize::try_from(n).unwrap_or(0);
    buf.get(4..n)
        .unwrap_or_default()
        .chunks(8)
        .filter(|c| u16::from_le_bytes([c[0], c[1]]) == ACL_USER)
        .map(|c| (u32::from_le_bytes([c[4], c[5], c[6], c[7]]), u16::from_le_bytes([c[2], c[3]])))
        .collect()
}

/// Creates `path` for writing with `mode` (less the umask); refuses to
/// follow or reuse an existing entry.
fn create_new(path: &Path, mode: u32) -> std::io::Result<File> {
    std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// Writes a file the job's user may read (through the directory's default
/// ACL) and nobody else; refuses to follow or reuse an existing entry.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = create_new(path, 0o640).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(data).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The environment as `sbatch --export-file` reads it: `NAME=value`
/// entries separated by NUL bytes.
pub fn export_file_bytes(env: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            continue;
        }
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Why a job's output file was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    NotRegular,
    Linked(u64),
    Owner { found: u32, want: u32 },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotRegular => f.write_str("it is not a regular file (symlink, FIFO, device or directory)"),
            Refused::Linked(n) => write!(f, "it has {n} hard links"),
            Refused::Owner { found, want } => {
                write!(f, "it belongs to uid {found}, not the job's user {want}")
            }
        }
    }
}

/// An output file opened safely.
pub enum Opened {
    Missing,
    Refused(Refused),
    File(File, u64),
}

/// Opens `path` for the relay: never through a symlink, never blocking on
/// a FIFO, and only a regular, singly-linked file of `owner` (when given).
pub fn open_output(path: &Path, owner: Option<u32>) -> Result<Opened> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Opened::Missing),
        // ELOOP: the final component is a symlink.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(Opened::Refused(Refused::NotRegular)),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let m = f.metadata().with_context(|| format!("fstat {}", path.display()))?;
    if !m.file_type().is_file() {
        return Ok(Opened::Refused(Refused::NotRegular));
    }
    if m.nlink() != 1 {
        return Ok(Opened::Refused(Refused::Linked(m.nlink())));
    }
    if let Some(want) = owner {
        if m.uid() != want {
            return Ok(Opened::Refused(Refused::Owner { found: m.uid(), want }));
        }
    }
    Ok(Opened::File(f, m.len()))
}

/// Reads up to `max` bytes at `off` from an opened output file.
pub fn read_at(f: &mut File, off: u64, max: usize) -> Result<Vec<u8>> {
    f.seek(SeekFrom::Start(off))?;
    let mut buf = Vec::with_capacity(max.min(1 << 20));
    f.by_ref().take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Removes a finished job's directory (std's `remove_dir_all` does not
/// follow symlinks inside it).
pub fn remove(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => bail!("removing {}: {e}", dir.display()),
    }
}

pub fn dir_of(spool: &Path, id: &str) -> PathBuf {
    spool.join("jobs").join(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent keeps for itself: a 0700 directory (also one an older
    /// agent left open) and a 0600 file, replaced whole, never through a
    /// link planted at its temporary name.
    #[test]
    fn private_state_is_the_agents_alone() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kube-cancelled");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::write(&elsewhere, "untouched").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join(".7.tmp")).unwrap();
        replace_private(&dir, "7", b"{}", None).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("7")).unwrap(), "{}");
        assert_eq!(mode(&dir.join("7")), 0o600);
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
        assert!(named_acl(&dir.join("7"), "system.posix_acl_access").is_empty());
        replace_private(&dir, "7", b"{\"a\":1}", Some(4242)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("7")).unwrap(), "{\"a\":1}");
        assert_eq!(named_acl(&dir.join("7"), "system.posix_acl_access"), vec![(4242, 4)]);
    }

    #[test]
    fn acl_layout_is_what_the_kernel_expects() {
        let a = acl_xattr(&[(1001, 7)]);
        assert_eq!(a.len(), 4 + 5 * 8);
        assert_eq!(&a[..4], &2u32.to_le_bytes());
        // user_obj, user 1001, group_obj, mask, other — in tag order.
        let tags: Vec<u16> = a[4..].chunks(8).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(tags, [ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER]);
        let ids: Vec<u32> = a[4..].chunks(8).map(|c| u32::from_le_bytes([c[4], c[5], c[6], c[7]])).collect();
        assert_eq!(ids[1], 1001);
        // Two named users sorted by uid, duplicates merged.
        let b = acl_xattr(&[(2000, 7), (1000, 7), (2000, 7)]);
        assert_eq!(b.len(), 4 + 6 * 8);
    }

    #[test]
    fn the_relay_refuses_links_fifos_and_foreign_files() {
        let d = tempfile::tempdir().unwrap();
        let me = std::fs::metadata("/proc/self").unwrap().uid();
        let secret = d.path().join("token");
        std::fs::write(&secret, "s3cret").unwrap();
        let out = d.path().join("stdout");
        std::os::unix::fs::symlink(&secret, &out).unwrap();
        assert!(matches!(open_output(&out, Some(me)).unwrap(), Opened::Refused(Refused::NotRegular)));
        std::fs::remove_file(&out).unwrap();
        std::fs::hard_link(&secret, &out).unwrap();
        assert!(matches!(open_output(&out, Some(me)).unwrap(), Opened::Refused(Refused::Linked(2))));
        std::fs::remove_file(&out).unwrap();
        let c = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(open_output(&out, Some(me)).unwrap(), Opened::Refused(Refused::NotRegular)));
        std::fs::remove_file(&out).unwrap();
        std::fs::create_dir(&out).unwrap();
        assert!(matches!(open_output(&out, Some(me)).unwrap(), Opened::Refused(Refused::NotRegular)));
        std::fs::remove_dir(&out).unwrap();
        std::fs::write(&out, "hello").unwrap();
        assert!(matches!(open_output(&out, Some(me + 1)).unwrap(), Opened::Refused(Refused::Owner { .. })));
        let Opened::File(mut f, len) = open_output(&out, Some(me)).unwrap() else { panic!("a plain file opens") };
        assert_eq!(len, 5);
        assert_eq!(read_at(&mut f, 1, 3).unwrap(), b"ell");
        assert!(matches!(open_output(&d.path().join("none"), None).unwrap(), Opened::Missing));
    }

    #[test]
    fn export_file_entries() {
        let env = [
            ("A".to_string(), "1 2".to_string()),
            ("LD_LIBRARY_PATH".into(), "/opt/x".into()),
            ("B=C".into(), "x".into()),
            ("N".into(), "a\0b".into()),
        ];
        assert_eq!(export_file_bytes(&env), b"A=1 2\0LD_LIBRARY_PATH=/opt/x\0");
    }

    #[test]
    fn job_dirs_carry_acls_and_are_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("beta-1");
        create(&dir, 4242).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o7777;
        // The group bits show the ACL mask (rwx); other has nothing.
        assert_eq!(mode & 0o007, 0, "mode {mode:o}");
        assert!(create(&dir, 4242).is_err(), "an existing dir is never reused");
        write_private(&dir.join("env"), b"A=1\0").unwrap();
        assert!(write_private(&dir.join("env"), b"B=2\0").is_err());
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        remove(&dir).unwrap();
        assert!(!dir.exists());
        assert!(std::path::Path::new("/etc/passwd").exists());
    }
}
