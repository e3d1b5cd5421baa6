//! The fleet view as the agent last published it (`AgentSpoolDir/view.json`),
//! cached in the plugin and reloaded when the file's mtime changes.
//!
//! Only a "stays home" answer is taken from it; anything else goes to the
//! agent, which journals forwards. A missing, unreadable, stale (older than
//! `ViewMaxAgeMs`) or unparsable view simply means "ask the agent".

use std::sync::Mutex;
use std::time::SystemTime;

use fleet_api::api::FleetView;
use fleet_api::placement::{fits, origin_fits, place, place_or_wait, Placement};
use fleet_api::JobRequest;

use crate::PluginConfig;

/// Largest view file read (a fleet of thousands of clusters fits).
const MAX_VIEW_BYTES: u64 = 8 << 20;

#[derive(Default)]
pub struct ViewCache {
    inner: Mutex<Option<(SystemTime, FleetView)>>,
}

impl ViewCache {
    /// True when a fresh published view places `job` at its origin.
    pub fn stays_home(&self, cfg: &PluginConfig, job: &JobRequest) -> bool {
        self.with_view(cfg, |v| matches!(place(v, job).0, Placement::Home { .. })).unwrap_or(false)
    }

    /// The cluster the published view sends `job` to, when it must leave
    /// (`None`: it stays, cannot run anywhere, or there is no view). A
    /// view older than `ViewMaxAgeMs` (the agent is down) still answers for
    /// a job the origin cannot run at all by its node shapes, which do not
    /// age; the agent places the job again, on a fresh view, when it
    /// forwards it.
    pub fn leaving_to(&self, cfg: &PluginConfig, job: &JobRequest) -> Option<String> {
        self.with_view_aged(cfg, true, |v, fresh| match place_or_wait(v, job).0 {
            Placement::Remote { target, .. } if fresh || !origin_fits(v, job) => Some(target),
            _ => None,
        })
        .flatten()
    }

    /// True when the published view (fresh or not: node shapes do not
    /// age) says the origin cannot run `job` natively. False without a
    /// view or with the origin missing from it (Slurm judges alone).
    pub fn origin_cannot_run(&self, cfg: &PluginConfig, job: &JobRequest) -> bool {
        self.with_view_aged(cfg, true, |v, _| !origin_fits(v, job)).unwrap_or(false)
    }

    /// `Some(Err(why))` when a fresh view says the origin cannot run `job`
    /// natively; `Some(Ok)` when it can; `None` without a fresh view or
    /// with the origin missing from it (Slurm then judges alone).
    pub fn origin_verdict(&self, cfg: &PluginConfig, job: &JobRequest) -> Option<Result<(), String>> {
        self.with_view(cfg, |v| v.clusters.iter().find(|c| c.name == job.origin).map(|c| fits(c, job).map(|_| ())))
            .flatten()
    }

    fn with_view<T>(&self, cfg: &PluginConfig, f: impl FnOnce(&FleetView) -> T) -> Option<T> {
        self.with_view_aged(cfg, false, |v, _| f(v))
    }

    /// `f(view, fresh)`; a stale view only when `stale_too`.
    fn with_view_aged<T>(
        &self,
        cfg: &PluginConfig,
        stale_too: bool,
        f: impl FnOnce(&FleetView, bool) -> T,
    ) -> Option<T> {
        let meta = std::fs::metadata(&cfg.view_path).ok()?;
        let mtime = meta.modified().ok()?;
        let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
        let fresh = age <= cfg.view_max_age;
        if (!fresh && !stale_too) || meta.len() > MAX_VIEW_BYTES {
            return None;
        }
        let mut guard = self.inner.lock().ok()?;
        if guard.as_ref().is_none_or(|(t, _)| *t != mtime) {
            let parsed = std::fs::read(&cfg.view_path).ok().and_then(|b| serde_json::from_slice::<FleetView>(&b).ok());
            *guard = parsed.map(|v| (mtime, v));
        }
        guard.as_ref().map(|(_, v)| f(v, fresh))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::api::{ClusterSummary, GpuPool};
    use fleet_api::{GpuRequest, GpuScope};

    fn view() -> FleetView {
        let c = |name: &str, ty: &str| ClusterSummary {
            name: name.into(),
            healthy: true,
            gpus: vec![GpuPool {
                gpu_type: ty.into(),
                total: 16,
                free: 16,
                max_per_node: 8,
                nodes: 2,
                ..GpuPool::default()
            }],
            ..Default::default()
        };
        FleetView { generated_at: 0.0, clusters: vec![c("alpha", "h100"), c("beta", "a100")] }
    }

    fn job(ty: &str) -> JobRequest {
        JobRequest {
            origin: "beta".into(),
            gpus: vec![GpuRequest { gpu_type: Some(ty.into()), count: 4, scope: GpuScope::Node }],
            ..Default::default()
        }
    }

    #[test]
    fn home_jobs_answered_from_a_fresh_view_only() {
        let dir = std::env::temp_dir().join(format!("fleet-view-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cfg = PluginConfig::for_tests("beta");
        cfg.view_path = dir.join("view.json");
        let cache = ViewCache::default();
        assert!(!cache.stays_home(&cfg, &job("a100")), "no view: ask the agent");
        std::fs::write(&cfg.view_path, serde_json::to_vec(&view()).unwrap()).unwrap();
        assert!(cache.stays_home(&cfg, &job("a100")));
        assert!(!cache.stays_home(&cfg, &job("h100")), "leaving jobs go to the agent");
        assert_eq!(cache.leaving_to(&cfg, &job("h100")).as_deref(), Some("alpha"));
        assert_eq!(cache.leaving_to(&cfg, &job("a100")), None);
        cfg.view_max_age = std::time::Duration::ZERO;
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(!cache.stays_home(&cfg, &job("a100")), "stale view: ask the agent");
        // A stale view still says that a job the origin cannot run leaves.
        assert_eq!(cache.leaving_to(&cfg, &job("h100")).as_deref(), Some("alpha"));
        cfg.view_max_age = std::time::Duration::from_secs(10);
        std::fs::write(&cfg.view_path, b"{ not json").unwrap();
        assert!(!cache.stays_home(&cfg, &job("a100")), "garbage view: ask the agent");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
