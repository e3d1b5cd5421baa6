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
