//! Prometheus metrics (`/metrics`), prefix `fleet_metasched`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    jobs: Family<Labels, Gauge>,
    heartbeats: Family<Labels, Counter>,
    requests: Family<Labels, Counter>,
    placements: Family<Labels, Counter>,
    feed_loads: Family<Labels, Counter>,
    spot_feeds: Family<Labels, Gauge>,
    proposals: Gauge,
    output_refused: Family<Labels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fleet_metasched");
        let jobs = Family::<Labels, Gauge>::default();
        let heartbeats = Family::<Labels, Counter>::default();
        let requests = Family::<Labels, Counter>::default();
        let placements = Family::<Labels, Counter>::default();
        registry.register("jobs", "Forwarded jobs by state", jobs.clone());
        registry.register("heartbeats", "Heartbeats received, by cluster", heartbeats.clone());
        registry.register("api_requests", "API requests by route and status", requests.clone());
        registry.register("placements", "Placement decisions by outcome", placements.clone());
        let feed_loads = Family::<Labels, Counter>::default();
        let proposals = Gauge::default();
        registry.register("feed_loads", "Carbon/egress/spot feed (re)loads, by result (ok, error)", feed_loads.clone());
        registry.register(
            "rebalance_proposals",
            "Migrations proposed by the latest rebalancing pass",
            proposals.clone(),
        );
        let spot_feeds = Family::<Labels, Gauge>::default();
        registry.register(
            "spot_feed_current",
            "Spot availability series by file: 1 while it covers the clock, 0 before its start or once stale (its clusters' spot pools then scored as configured)",
            spot_feeds.clone(),
        );
        let output_refused = Family::<Labels, Counter>::default();
        registry.register(
            "output_refused",
            "Output not kept, by why: room (the state directory's file system under output_min_free_bytes; the agent sends it again) or cap (a job passed output_max_job_bytes and was cancelled)",
            output_refused.clone(),
        );
        Metrics { registry, jobs, heartbeats, requests, placements, feed_loads, spot_feeds, proposals, output_refused }
    }

    pub fn heartbeat(&self, cluster: &str) {
        self.heartbeats.get_or_create(&vec![("cluster".into(), cluster.into())]).inc();
    }

    pub fn request(&self, route: &str, status: u16) {
        self.requests.get_or_create(&vec![("route".into(), route.into()), ("status".into(), status.to_string())]).inc();
    }

    /// Output not kept: `room` or `cap` (see the family's help).
    pub fn output_refused(&self, why: &str) {
        self.output_refused.get_or_create(&vec![("why".into(), why.into())]).inc();
    }

    pub fn placement(&self, outcome: &str) {
        self.placements.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
    }

    pub fn feed_load(&self, ok: bool) {
        self.feed_loads.get_or_create(&vec![("result".into(), if ok { "ok" } else { "error" }.into())]).inc();
    }

    /// Sets a spot series' gauge; returns whether it changed (unset counts
    /// as current).
    pub fn spot_feed(&self, series: &str, current: bool) -> bool {
        let g = self.spot_feeds.get_or_create(&vec![("series".into(), series.into())]);
        let was = g.get();
        g.set(current as i64);
        was != current as i64
    }

    pub fn rebalance_proposals(&self, n: usize) {
        self.proposals.set(n as i64);
    }

    /// Set the job gauges from a fresh count, then render the registry.
    pub fn render(&self, counts: &[(String, i64)]) -> String {
        use fleet_api::JobState::*;
        for s in [Held, Queued, Assigned, Pending, Running, Completed, Failed, Cancelled, Lost] {
            let n = counts.iter().find(|(k, _)| k == s.as_str()).map_or(0, |(_, n)| *n);
            self.jobs.get_or_create(&vec![("state".into(), s.as_str().into())]).set(n);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
