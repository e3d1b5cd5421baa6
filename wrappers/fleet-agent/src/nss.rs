//! Users and groups through the C library's name service switch (NSS), the
//! way slurmctld, slurmd and sudo see them: `/etc/passwd` first at most
//! sites, then the directory (LDAP through sssd, Active Directory,
//! extrausers, ...). A site whose researchers exist only in the directory
//! must be able to run their jobs, so the agent may not read the files
//! alone.
//!
//! Only the reentrant calls (`getpwnam_r`, `getpwuid_r`, `getgrnam_r`,
//! `getpwent_r`, `getgrouplist`) are used, with buffers that grow on
//! `ERANGE` up to [`MAX_BUF`]. A directory lookup may take as long as the
//! directory does: callers on the async runtime run these on a blocking
//! thread or off the hot path (the heartbeat's list is cached).
//!
//! **One lookup at a time in the process** ([`NSS`]). Reentrant calls are
//! only as thread-safe as every module in the site's chain, and some are
//! not: libnss-extrausers (Debian, Ubuntu: `passwd: files systemd
//! extrausers`) keeps one `FILE*` per database for the whole process, and
//! glibc's `getgrouplist` walks a module that has no `initgroups_dyn`
//! through its `setgrent`/`getgrent_r`/`endgrent`, so two threads close the
//! same stream twice: heap corruption that aborts the process later, in
//! whatever thread next frees or exits (`tcache_thread_shutdown():
//! unaligned tcache chunk detected` in the agent's kube test binary, whose
//! tests submit at once). Serialised, they cannot race.

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// The largest buffer a lookup may use (a group with tens of thousands of
/// members needs a few hundred KiB).
const MAX_BUF: usize = 4 << 20;

/// Held across every NSS call of this process (std's lock: NSS calls
/// block, and are never made across an `.await`).
static NSS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `f` (NSS calls) alone in this process.
fn alone<T>(f: impl FnOnce() -> T) -> T {
    // A panic while holding it leaves nothing half-done in NSS: go on.
    let _g = NSS.lock().unwrap_or_else(|e| e.into_inner());
    f()
}

/// One passwd entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passwd {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: Option<PathBuf>,
}

/// One group entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// `s` as a C string; a name holding NUL names no one.
fn cstr(s: &str) -> Option<CString> {
    CString::new(s).ok()
}

/// # Safety
/// `p` points to an entry filled by a successful `getpw*_r`.
unsafe fn passwd_from(p: &libc::passwd) -> Option<Passwd> {
    if p.pw_name.is_null() {
        return None;
    }
    // SAFETY: non-null fields of a filled entry are NUL-terminated strings
    // in the caller's buffer.
    let (name, home) = unsafe {
        (
            CStr::from_ptr(p.pw_name).to_str().ok()?.to_string(),
            (!p.pw_dir.is_null()).then(|| CStr::from_ptr(p.pw_dir).to_str().ok()).flatten().map(str::to_string),
        )
    };
    if name.is_empty() {
        return None;
    }
    let home = home.filter(|h| h.starts_with('/')).map(PathBuf::from);
    Some(Passwd { name, uid: p.pw_uid, gid: p.pw_gid, home })
}

/// Runs a reentrant lookup with a growing buffer, each try [`alone`].
/// `call` returns the C function's error number and whether an entry was
/// found.
fn with_buf<T>(mut call: impl FnMut(&mut Vec<libc::c_char>) -> (libc::c_int, Option<T>)) -> Option<T> {
    let mut buf: Vec<libc::c_char> = vec![0; 16 << 10];
    loop {
        match alone(|| call(&mut buf)) {
            (0, found) => return found,
            (libc::ERANGE, _) if buf.len() < MAX_BUF => {
                let n = buf.len() * 4;
                buf.resize(n, 0);
            }
            // EINTR: ask again; anything else (ENOENT, EIO from the
            // directory, ERANGE beyond the cap) means "not known here".
            (libc::EINTR, _) => continue,
            _ => return None,
        }
    }
}

/// The user called `name`.
pub fn user_by_name(name: &str) -> Option<Passwd> {
    let c = cstr(name)?;
    with_buf(|buf| {
        // SAFETY: every pointer is valid for the call; `res` points into
        // `pw`/`buf`, both alive while it is read.
        unsafe {
            let mut pw: libc::passwd = std::mem::zeroed();
            let mut res: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut res);
            (rc, if res.is_null() { None } else { passwd_from(&pw) })
        }
    })
    // Some modules answer a lookup of "Alice" with "alice": a name is only
    // the user it names.
    .filter(|p| p.name == name)
}

/// The user with `uid`.
pub fn user_by_uid(uid: u32) -> Option<Passwd> {
    with_buf(|buf| {
        // SAFETY: as in `user_by_name`.
        unsafe {
            let mut pw: libc::passwd = std::mem::zeroed();
            let mut res: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut res);
            (rc, if res.is_null() { None } else { passwd_from(&pw) })
        }
    })
    .filter(|p| p.uid == uid)
}

/// The group called `name`.
pub fn group_by_name(name: &str) -> Option<Group> {
    let c = cstr(name)?;
    with_buf(|buf| {
        // SAFETY: as in `user_by_name`; `gr_mem` is a NULL-terminated array
        // of C strings inside `buf`.
        unsafe {
            let mut gr: libc::group = std::mem::zeroed();
            let mut res: *mut libc::group = std::ptr::null_mut();
            let rc = libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut res);
            if res.is_null() || gr.gr_name.is_null() {
                return (rc, None);
            }
            let mut members = Vec::new();
            let mut m = gr.gr_mem;
            while !m.is_null() && !(*m).is_null() {
                if let Ok(s) = CStr::from_ptr(*m).to_str() {
                    if !s.is_empty() {
                        members.push(s.to_string());
                    }
                }
                m = m.add(1);
            }
            let name = CStr::from_ptr(gr.gr_name).to_string_lossy().into_owned();
            (rc, Some(Group { name, gid: gr.gr_gid, members }))
        }
    })
    .filter(|g| g.name == name)
}

/// Every group `name` (primary group `gid`) belongs to, `gid` included,
/// as `initgroups` would give a login of that user.
pub fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Some(c) = cstr(name) else { return vec![gid] };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
        let mut count = n;
        // SAFETY: `groups` holds `count` entries; getgrouplist writes at
        // most that many and sets `count` to the number it needs.
        let rc = alone(|| unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut count) });
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            if !groups.contains(&gid) {
                groups.insert(0, gid);
            }
            return groups;
        }
        // Too small: `count` says how many there are (grow at least 2x).
        if n >= 1 << 20 {
            return vec![gid];
        }
        n = count.max(n * 2).min(1 << 20);
    }
}

/// Users whose primary group is `gid`, among those the NSS sources list
/// when enumerated (local files always; a directory only where the site
/// enables enumeration, e.g. sssd's `enumerate = true`). Bounded: at most
/// `limit` entries are looked at.
pub fn users_with_primary_gid(gid: u32, limit: usize) -> Vec<String> {
    // getpwent_r walks process-global state: one walker at a time, and no
    // other lookup meanwhile.
    let _guard = NSS.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    let mut buf: Vec<libc::c_char> = vec![0; 16 << 10];
    // SAFETY: setpwent/getpwent_r/endpwent under the walker lock; the
    // pointers passed live for each call.
    unsafe {
        libc::setpwent();
        let mut seen = 0;
        while seen < limit {
            let mut pw: libc::passwd = std::mem::zeroed();
            let mut res: *mut libc::passwd = std::ptr::null_mut();
            let rc = libc::getpwent_r(&mut pw, buf.as_mut_ptr(), buf.len(), &mut res);
            if rc == libc::ERANGE && buf.len() < MAX_BUF {
                let n = buf.len() * 4;
                buf.resize(n, 0);
                continue;
            }
            if rc != 0 || res.is_null() {
                break;
            }
            seen += 1;
            if let Some(p) = passwd_from(&pw) {
                if p.gid == gid && !out.contains(&p.name) {
                    out.push(p.name);
                }
            }
        }
        libc::endpwent();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_known_by_name_and_uid() {
        let r = user_by_name("root").expect("root exists on every Linux");
        assert_eq!((r.uid, r.gid), (0, 0));
        assert_eq!(r.home.as_deref(), Some(std::path::Path::new("/root")));
        assert_eq!(user_by_uid(0).map(|p| p.name), Some("root".to_string()));
        let g = group_by_name("root").expect("group root");
        assert_eq!(g.gid, 0);
        assert!(group_list("root", 0).contains(&0));
        assert!(users_with_primary_gid(0, 100_000).contains(&"root".to_string()));
    }

    #[test]
    fn unknown_and_hostile_names_are_no_one() {
        assert_eq!(user_by_name("no-such-user-fleet-test"), None);
        assert_eq!(user_by_name("ro\0ot"), None);
        assert_eq!(user_by_name(""), None);
        assert_eq!(group_by_name("no-such-group-fleet-test"), None);
        assert_eq!(group_by_name("ro\0ot"), None);
        assert_eq!(user_by_uid(4_000_000_000), None);
        // A user nobody knows still belongs to the group they were given.
        assert_eq!(group_list("no-such-user-fleet-test", 4242), vec![4242]);
        assert_eq!(group_list("bad\0name", 7), vec![7]);
    }

    /// Lookups from many threads at once, as the agent makes them (its
    /// submissions run concurrently): with an NSS module that is not
    /// thread-safe in the chain (libnss-extrausers keeps one `FILE*` for
    /// its whole process, and glibc's `getgrouplist` enumerates a module
    /// without `initgroups_dyn` through it), unserialised calls corrupt the
    /// heap (double `fclose`) and the process aborts.
    #[test]
    fn lookups_from_many_threads_at_once_are_safe() {
        let root_groups = group_list("root", 0);
        for round in 0..40 {
            let threads: Vec<_> = (0..8)
                .map(|t| {
                    std::thread::spawn(move || {
                        let names = ["root", "no-such-user-fleet-test", "nobody", "daemon"];
                        for i in 0..30 {
                            let n = names[(t + i + round) % names.len()];
                            let _ = group_list(n, 0);
                            if i % 10 == 0 {
                                let _ = (user_by_name(n), group_by_name(n), user_by_uid(0));
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("a lookup thread");
            }
        }
        assert_eq!(group_list("root", 0), root_groups);
    }

    #[test]
    fn a_lookup_agrees_with_the_files_for_local_users() {
        // Every /etc/passwd user NSS resolves has the same ids through it.
        let text = std::fs::read_to_string("/etc/passwd").unwrap();
        let mut checked = 0;
        for l in text.lines() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 || f[0].is_empty() {
                continue;
            }
            let p = user_by_name(f[0]).unwrap_or_else(|| panic!("{} not found through NSS", f[0]));
            assert_eq!(p.uid.to_string(), f[2], "{}", f[0]);
            assert_eq!(p.gid.to_string(), f[3], "{}", f[0]);
            checked += 1;
        }
        assert!(checked > 0);
    }
}
