//! The names of submitting uids, remembered for the plugin's FORWARD path.
//!
//! A FORWARD answer names the job's user (`JobRequest::user_name`, from
//! this host's accounts, never from the request). Looking it up through
//! NSS means a hop to a blocking thread and the process-wide NSS lock
//! ([`crate::nss`]): on a loaded host, each hop waits for the scheduler
//! and the lock may be held by a heartbeat's user walk. That cost was
//! the largest part of the sync FORWARD hook's time (milliseconds at p50,
//! tens at p99 in `make bench` on a busy host). A uid's name changes rarely,
//! so a name found is used for [`NAME_TTL`], like the list of admitted
//! users the heartbeat publishes ([`crate::identity::NSS_REFRESH`]).
//! A uid not found is not remembered: a user just added is looked up
//! again at the next submission.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a name found is used without asking NSS again.
pub const NAME_TTL: Duration = Duration::from_secs(60);

/// At most this many uids are remembered; past it, the cache starts over
/// (a site with more distinct submitters a minute pays a lookup each).
const MAX_NAMES: usize = 4096;

#[derive(Default)]
pub struct NameCache {
    names: HashMap<u32, (String, Instant)>,
}

impl NameCache {
    /// The name of `uid` if found within [`NAME_TTL`] of `now`.
    pub fn get(&self, uid: u32, now: Instant) -> Option<String> {
        self.names.get(&uid).filter(|(_, at)| now.saturating_duration_since(*at) < NAME_TTL).map(|(n, _)| n.clone())
    }

    /// Remember what a lookup at `now` found (nothing: forget the uid).
    pub fn put(&mut self, uid: u32, name: Option<&str>, now: Instant) {
        match name {
            Some(n) => {
                if self.names.len() >= MAX_NAMES && !self.names.contains_key(&uid) {
                    self.names.clear();
                }
                self.names.insert(uid, (n.to_string(), now));
            }
            None => {
                self.names.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_used_until_it_expires_and_a_miss_is_not_kept() {
        let t0 = Instant::now();
        let mut c = NameCache::default();
        assert_eq!(c.get(1000, t0), None);
        c.put(1000, Some("alice"), t0);
        assert_eq!(c.get(1000, t0 + NAME_TTL / 2).as_deref(), Some("alice"));
        assert_eq!(c.get(1001, t0), None);
        assert_eq!(c.get(1000, t0 + NAME_TTL), None, "expired");
        // Looked up again: the new name replaces the old one.
        c.put(1000, Some("alice2"), t0 + NAME_TTL);
        assert_eq!(c.get(1000, t0 + NAME_TTL).as_deref(), Some("alice2"));
        // A lookup that found nothing (user removed) forgets the uid.
        c.put(1000, None, t0 + NAME_TTL);
        assert_eq!(c.get(1000, t0 + NAME_TTL), None);
    }

    #[test]
    fn the_cache_is_bounded() {
        let t0 = Instant::now();
        let mut c = NameCache::default();
        for uid in 0..MAX_NAMES as u32 {
            c.put(uid, Some("u"), t0);
        }
        assert_eq!(c.names.len(), MAX_NAMES);
        // A known uid refreshed: nothing dropped.
        c.put(5, Some("u"), t0);
        assert_eq!(c.names.len(), MAX_NAMES);
        // One more: starts over, holding only the new one.
        c.put(MAX_NAMES as u32, Some("new"), t0);
        assert_eq!(c.names.len(), 1);
        assert_eq!(c.get(MAX_NAMES as u32, t0).as_deref(), Some("new"));
    }
}
