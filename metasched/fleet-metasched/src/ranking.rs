//! Optional cost-engine ranking (`[placement] policy = "<engine policy>"`).
//!
//! The shared first rule (`fleet_api::placement::place`) still decides what
//! is possible at all; the engine only ranks the clusters that rule allows.

use fleet_api::api::FleetView;
use fleet_api::JobRequest;
use fleet_engine::{Decision, FleetModel, FleetState, JobSpec, Policies, Policy};

use crate::config::{Config, ConfigError};

pub struct Ranker {
    /// The model as configured, before any price feed.
    base: FleetModel,
    model: FleetModel,
    policy: Policy,
}

/// Where `fleetctl prices import` keeps the last imported table; it wins
/// over the configured `prices` feed at start-up.
pub fn imported_prices_path(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join("prices.csv")
}

/// The engine's pick among allowed clusters.
pub struct Pick {
    pub cluster: String,
    pub reason: String,
}

impl Ranker {
    /// `None` when the configuration asks for the first rule only.
    pub fn load(config: &Config) -> Result<Option<Ranker>, ConfigError> {
        let Some(pc) = &config.placement else { return Ok(None) };
        let Some(name) = pc.engine_policy() else { return Ok(None) };
        let Some(model_path) = &pc.fleet_model else {
            return Err(ConfigError::Invalid("[placement] fleet_model is required for an engine policy".into()));
        };
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })
        };
        let base = FleetModel::from_toml_str(&read(model_path)?)
            .map_err(|e| ConfigError::Invalid(format!("fleet model {}: {e}", model_path.display())))?;
        let imported = imported_prices_path(&config.state_dir);
        let feed = if imported.exists() { Some(imported) } else { config.prices.clone() };
        let model = match &feed {
            Some(prices) => {
                let table = fleet_engine::parse_prices(&read(prices)?)
                    .map_err(|e| ConfigError::Invalid(format!("price feed {}: {e}", prices.display())))?;
                base.with_prices(&table, false)
            }
            None => base.clone(),
        };
        let policies = match &config.policies {
            None => Policies::builtin(),
            Some(t) => {
                let mut doc = toml::Table::new();
                doc.insert("policies".into(), toml::Value::Table(t.clone()));
                let text = toml::to_string(&doc).map_err(|e| ConfigError::Invalid(format!("[policies]: {e}")))?;
                Policies::from_toml_str(&text).map_err(|e| ConfigError::Invalid(e.to_string()))?
            }
        };
        let Some(policy) = policies.get(name).cloned() else {
            let known = policies.names().collect::<Vec<_>>().join(", ");
            return Err(ConfigError::Invalid(format!("[placement] policy {name:?} is unknown (first-fit, {known})")));
        };
        Ok(Some(Ranker { base, model, policy }))
    }

    /// This ranker with the configured model repriced by `table`.
    pub fn with_prices(&self, table: &fleet_engine::PriceTable) -> Ranker {
        Ranker { base: self.base.clone(), model: self.base.with_prices(table, false), policy: self.policy.clone() }
    }

    pub fn policy_name(&self) -> &str {
        &self.policy.name
    }

    /// The engine's ranked explanation of `req` on `view`.
    pub fn explain(&self, view: &FleetView, req: &JobRequest, id: &str) -> (Decision, Vec<String>) {
        let (mut spec, errs) = JobSpec::from_request_script(req);
        spec.id = id.to_string();
        let state = FleetState::from_view(&self.model, view);
        let d = fleet_engine::explain(&self.model, &state, &spec, &self.policy);
        (d, errs.iter().map(|e| e.to_string()).collect())
    }

    /// The best-ranked cluster among `allowed`; `None` when the engine
    /// ranks none of them (then the first rule's pick stands).
    pub fn pick(&self, view: &FleetView, req: &JobRequest, id: &str, allowed: &[String]) -> Option<Pick> {
        let (d, _) = self.explain(view, req, id);
        let n = d.ranked.len();
        d.ranked.iter().enumerate().find(|(_, c)| allowed.contains(&c.cluster)).map(|(i, c)| Pick {
            cluster: c.cluster.clone(),
            reason: format!(
                "policy {}: {} ranked {} of {n} ({} {} {}, {:.2} USD/GPU-h, score {:.2}{})",
                self.policy.name,
                c.cluster,
                i + 1,
                c.pool,
                c.gpu_type,
                c.pricing.as_str(),
                c.breakdown.price_per_gpu_hour,
                c.breakdown.total,
                if c.fits_now { "" } else { ", waits" }
            ),
        })
    }
}
