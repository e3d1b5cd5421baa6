//! Dynamic state: what changes between decisions (free GPUs, queue waits,
//! spot availability and price, carbon intensity). The live meta-scheduler
//! builds it from heartbeats ([`FleetState::from_view`]); the simulator
//! from its own queues. Kept apart from the static [`FleetModel`].

use std::sync::Arc;

use fleet_api::api::FleetView;

use crate::feeds::CarbonSeries;
use crate::model::{FleetModel, Health};

#[derive(Clone, Debug, PartialEq)]
pub struct PoolState {
    pub free_gpus: u32,
    /// Expected wait for a job that does not fit now (s); `None` = use
    /// the model's history mean.
    pub expected_wait_s: Option<f64>,
    pub spot_available: bool,
    /// When `spot_available` is false: the expected wait (s) until a job of
    /// this size could start on this pool's spot capacity (the spot level
    /// coming back, spot jobs ahead of it ending). `None` = unknown, and then
    /// spot is offered only when it is available now. A policy with
    /// [`crate::Policy::spot_queue`] may queue for spot with this wait,
    /// priced at its time value.
    pub spot_wait_s: Option<f64>,
    /// Current spot price per GPU-hour; `None` = the model's spot price.
    pub spot_price: Option<f64>,
    /// How long (s) spot capacity stays short after a reclaim, on average (a
    /// preempted job waiting for spot again); `None` = not priced.
    pub spot_recovery_s: Option<f64>,
    /// Current preemption rate; `None` = the cluster's configured rate.
    pub spot_preemptions_per_hour: Option<f64>,
    /// The lengths of the pool's spot windows (stretches of availability), when
    /// known: how long a job started on spot now keeps it before its first
    /// reclaim, where windows are not exponential ([`SpotWindows`]). `None` =
    /// exponential at the preemption rate.
    pub spot_windows: Option<Arc<SpotWindows>>,
    /// When the spot window the pool is in now began (unix s), when known
    /// and spot is available: a job starting now is in a window that has
    /// lasted `now − since` already ([`SpotWindows::first_stretch`]).
    pub spot_window_since_unix: Option<f64>,
}

/// The lengths of a pool's spot windows, for the time until the first reclaim
/// of a job that starts on spot at a random moment of availability: it lands
/// in a window with probability proportional to the window's length, at a
/// uniform point of it. Real windows are heavy-tailed (many of minutes, a few
/// of days), so a start is more likely in a long window than the mean length
/// says: the job keeps spot longer, and is reclaimed less often within its
/// run, than an exponential at the same rate gives (the expected *number* of
/// window ends within a run is the same, rate × run).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpotWindows {
    /// Window lengths (h), ascending, finite and > 0.
    len_h: Vec<f64>,
    /// Prefix sums of the lengths and of their squares (`[0]` = 0).
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
}

impl SpotWindows {
    /// From window lengths in hours; the others (not finite, ≤ 0) are dropped.
    /// `None` when none is left.
    pub fn new(mut len_h: Vec<f64>) -> Option<SpotWindows> {
        len_h.retain(|x| x.is_finite() && *x > 0.0);
        if len_h.is_empty() {
            return None;
        }
        len_h.sort_by(f64::total_cmp);
        let mut sum = Vec::with_capacity(len_h.len() + 1);
        let mut sum_sq = Vec::with_capacity(len_h.len() + 1);
        let (mut a, mut b) = (0.0, 0.0);
        sum.push(0.0);
        sum_sq.push(0.0);
        for w in &len_h {
            a += w;
            b += w * w;
            sum.push(a);
            sum_sq.push(b);
        }
        Some(SpotWindows { len_h, sum, sum_sq })
    }

    /// The window lengths (h), ascending.
    pub fn lengths_h(&self) -> &[f64] {
        &self.len_h
    }

    /// For a job that needs `d_h` hours on spot and starts on it now (R the
    /// time left in its window): (E[min(R, d)], P(R ≤ d)).
    ///
    /// In a window that has lasted `age_h`: R = W − age over the windows W
    /// longer than that, each as likely. Without an age, or past the longest
    /// window: a random moment of availability, where a window of length w
    /// holds the start with weight w, R uniform on [0, w]: min's mean w/2 if w
    /// ≤ d, else d − d²/2w; P 1 if w ≤ d, else d/w.
    pub fn first_stretch(&self, d_h: f64, age_h: Option<f64>) -> (f64, f64) {
        let n = self.len_h.len();
        let total = self.sum[n];
        if d_h.is_nan() || d_h <= 0.0 || total <= 0.0 {
            return (0.0, 0.0);
        }
        if let Some(a) = age_h.filter(|a| a.is_finite() && *a >= 0.0) {
            let k0 = self.len_h.partition_point(|w| *w <= a);
            if k0 < n {
                let k1 = self.len_h.partition_point(|w| *w <= a + d_h);
                let alive = (n - k0) as f64;
                let ending = (k1 - k0) as f64;
                let e = (self.sum[k1] - self.sum[k0] - a * ending + d_h * (n - k1) as f64) / alive;
                return (e.clamp(0.0, d_h), (ending / alive).clamp(0.0, 1.0));
            }
        }
        // Windows no longer than d: the first k.
        let k = self.len_h.partition_point(|w| *w <= d_h);
        let longer = (n - k) as f64;
        let sum_longer = total - self.sum[k];
        let e = (self.sum_sq[k] / 2.0 + d_h * sum_longer - d_h * d_h / 2.0 * longer) / total;
        let p = (self.sum[k] + d_h * longer) / total;
        (e.clamp(0.0, d_h), p.clamp(0.0, 1.0))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClusterState {
    /// Heartbeat seen recently.
    pub healthy: bool,
    /// Same order as the model cluster's `pools`.
    pub pools: Vec<PoolState>,
    pub queue_pending: u32,
    /// Current grid intensity (gCO2/kWh) when no series covers the zone.
    pub carbon_g_per_kwh: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct FleetState {
    /// Unix seconds "now" (used with carbon series).
    pub now_unix: f64,
    /// Same order as [`FleetModel::clusters`].
    pub clusters: Vec<ClusterState>,
    /// Carbon series by carbon-zone id ([`FleetModel::carbon_zones`]).
    pub carbon: Vec<Option<Arc<CarbonSeries>>>,
}

impl FleetState {
    /// Every cluster healthy, every GPU free, spot available, no series.
    pub fn idle(model: &FleetModel) -> FleetState {
        FleetState {
            now_unix: 0.0,
            clusters: model
                .clusters
                .iter()
                .map(|c| ClusterState {
                    healthy: c.health != Health::Down,
                    pools: c
                        .pools
                        .iter()
                        .map(|p| PoolState {
                            free_gpus: p.total_gpus,
                            expected_wait_s: None,
                            spot_available: p.prices.spot.is_some(),
                            spot_wait_s: None,
                            spot_recovery_s: None,
                            spot_price: None,
                            spot_preemptions_per_hour: None,
                            spot_windows: None,
                            spot_window_since_unix: None,
                        })
                        .collect(),
                    queue_pending: 0,
                    carbon_g_per_kwh: None,
                })
                .collect(),
            carbon: vec![None; model.carbon_zones.len()],
        }
    }

    /// Attaches a carbon series to the zone it names; returns false when
    /// no cluster uses that zone.
    pub fn set_carbon_series(&mut self, model: &FleetModel, series: Arc<CarbonSeries>) -> bool {
        let Some(i) = model.carbon_zones.iter().position(|z| *z == series.zone) else {
            return false;
        };
        if self.carbon.len() < model.carbon_zones.len() {
            self.carbon.resize(model.carbon_zones.len(), None);
        }
        self.carbon[i] = Some(series);
        true
    }

    /// The state the live meta-scheduler sees: free GPUs from the fleet
    /// view (split over the model's pools of each type in order), health,
    /// queue depth. Clusters missing from the view are unhealthy.
    pub fn from_view(model: &FleetModel, view: &FleetView) -> FleetState {
        let mut st = FleetState::idle(model);
        st.now_unix = view.generated_at;
        for (ci, c) in model.clusters.iter().enumerate() {
            let Some(cs) = st.clusters.get_mut(ci) else {
                continue;
            };
            let Some(s) = view.clusters.iter().find(|s| s.name == c.name) else {
                cs.healthy = false;
                continue;
            };
            cs.healthy = s.healthy && c.health != Health::Down;
            cs.queue_pending = s.queue_pending;
            let mut left: Vec<(String, u32)> =
                s.gpus.iter().map(|g| (crate::model::normalize_gpu_type(&g.gpu_type), g.free)).collect();
            for (pi, p) in c.pools.iter().enumerate() {
                let name = model.gpu_type_name(p.gpu_type);
                let free = left.iter_mut().find(|(t, _)| t == name).map(|(_, f)| {
                    let take = (*f).min(p.total_gpus);
                    *f -= take;
                    take
                });
                if let Some(ps) = cs.pools.get_mut(pi) {
                    ps.free_gpus = free.unwrap_or(0);
                }
            }
        }
        st
    }
}
