//! Named placement policies and their weights (`[policies.<name>]` in
//! `metasched.toml`; see `conf/metasched-policies.toml`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Weights that turn a candidate's breakdown into one USD score:
/// `total = egress_weight × egress + compute + (time_value × GPUs +
/// job_time_value) × delay_h + carbon_price × kgCO2`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Filled from the table name.
    #[serde(skip)]
    pub name: String,
    /// USD per GPU-hour of delay (queue wait, transfer, fixed overheads,
    /// work lost to preemption).
    pub time_value_usd_per_gpu_hour: f64,
    /// USD per hour of delay of a job, whatever its GPUs: what a mean
    /// completion over jobs counts (a one-GPU job waiting an hour adds as much
    /// to it as a 64-GPU one). Added to the per-GPU value above; 0 in the
    /// built-ins. See [`Policy::time_value`].
    pub time_value_usd_per_job_hour: f64,
    /// USD per kg CO2 (a shadow price; 0 ignores carbon).
    pub carbon_usd_per_kg: f64,
    /// Multiplier on egress USD (1 = count it at list price).
    pub egress_weight: f64,
    /// Spot capacity may be used for interruptible jobs.
    pub allow_spot: bool,
    /// An interruptible job may queue for a pool's spot capacity that is not
    /// free now, when the state gives the expected wait for it
    /// ([`crate::state::PoolState::spot_wait_s`]); the wait is priced at the
    /// time value like any queue. Off: spot only when free now (what
    /// managed-spot tools do: launch on spot, else fail over).
    pub spot_queue: bool,
    /// A job reclaimed from spot this many times is offered no more spot
    /// (it goes on-demand); 0 = no cap.
    pub spot_max_reclaims: u32,
    /// A job that has lost this many hours of run time to spot reclaims
    /// (work since its last checkpoint; all of it for a job that writes
    /// none) is offered no more spot; 0 = no cap.
    pub spot_max_lost_h: f64,
    /// Use life-cycle intensity (`ci_lca`) instead of direct.
    pub use_lca: bool,
    /// Score owned GPUs at their running cost (the fleet file's `running`:
    /// power and cooling) instead of their amortized price: the hardware is
    /// paid for whether it is used or not, so an idle owned GPU costs only
    /// what running it adds. Off in the built-ins (owned GPUs at their
    /// amortized price, as a chargeback would bill them).
    pub owned_at_running_cost: bool,
}

/// Default spot caps of the built-in policies (see [`Policy::spot_max_reclaims`]).
pub const SPOT_MAX_RECLAIMS: u32 = 50;
/// Default cap of run hours lost to reclaims (see [`Policy::spot_max_lost_h`]).
pub const SPOT_MAX_LOST_H: f64 = 24.0;

impl Default for Policy {
    fn default() -> Self {
        Policy::cost()
    }
}

impl Policy {
    /// Lowest expected USD; delay valued at 2 USD per GPU-hour.
    pub fn cost() -> Policy {
        Policy {
            name: "cost".into(),
            time_value_usd_per_gpu_hour: 2.0,
            time_value_usd_per_job_hour: 0.0,
            carbon_usd_per_kg: 0.0,
            egress_weight: 1.0,
            allow_spot: true,
            spot_queue: true,
            spot_max_reclaims: SPOT_MAX_RECLAIMS,
            spot_max_lost_h: SPOT_MAX_LOST_H,
            use_lca: false,
            owned_at_running_cost: false,
        }
    }

    /// Shortest completion: delay valued at 20 USD per GPU-hour, no spot.
    pub fn time() -> Policy {
        Policy {
            name: "time".into(),
            time_value_usd_per_gpu_hour: 20.0,
            time_value_usd_per_job_hour: 0.0,
            carbon_usd_per_kg: 0.0,
            egress_weight: 1.0,
            allow_spot: false,
            spot_queue: false,
            spot_max_reclaims: SPOT_MAX_RECLAIMS,
            spot_max_lost_h: SPOT_MAX_LOST_H,
            use_lca: false,
            owned_at_running_cost: false,
        }
    }

    /// Cost plus a carbon shadow price of 1 USD/kg (≈ 5× the US EPA 2023
    /// social cost of carbon), so that clean zones win near-ties.
    pub fn green() -> Policy {
        Policy {
            name: "green".into(),
            time_value_usd_per_gpu_hour: 2.0,
            time_value_usd_per_job_hour: 0.0,
            carbon_usd_per_kg: 1.0,
            egress_weight: 1.0,
            allow_spot: true,
            spot_queue: true,
            spot_max_reclaims: SPOT_MAX_RECLAIMS,
            spot_max_lost_h: SPOT_MAX_LOST_H,
            use_lca: false,
            owned_at_running_cost: false,
        }
    }

    /// USD per GPU-hour of delay of a job on `gpus` GPUs: the per-GPU time
    /// value plus the per-job one spread over its GPUs (so `time_value(g) × g
    /// × delay_h` prices the delay).
    #[inline]
    pub fn time_value(&self, gpus: u32) -> f64 {
        self.time_value_usd_per_gpu_hour + self.time_value_usd_per_job_hour / f64::from(gpus.max(1))
    }

    fn valid(&self) -> Result<(), String> {
        for (k, v) in [
            ("time_value_usd_per_gpu_hour", self.time_value_usd_per_gpu_hour),
            ("time_value_usd_per_job_hour", self.time_value_usd_per_job_hour),
            ("carbon_usd_per_kg", self.carbon_usd_per_kg),
            ("egress_weight", self.egress_weight),
            ("spot_max_lost_h", self.spot_max_lost_h),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{k} must be finite and >= 0"));
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A TOML error or an invalid value, at its place in the file.
    #[error("{file}:{line}:{col}: {msg}")]
    At { file: String, line: usize, col: usize, msg: String },
}

/// The named policies. Built-ins `cost`, `time`, `green` exist unless the
/// file redefines them; a table may set only some keys (the rest come
/// from the built-in of the same name, or from `cost`).
#[derive(Clone, Debug, PartialEq)]
pub struct Policies {
    pub by_name: BTreeMap<String, Policy>,
}

impl Default for Policies {
    fn default() -> Self {
        Policies::builtin()
    }
}

/// One `[policies.<name>]` table as written: every key optional, an
/// unknown key (a typo) an error. Keys are those of [`Policy`] (checked by
/// `every_policy_key_is_accepted`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyKeys {
    time_value_usd_per_gpu_hour: Option<f64>,
    time_value_usd_per_job_hour: Option<f64>,
    carbon_usd_per_kg: Option<f64>,
    egress_weight: Option<f64>,
    allow_spot: Option<bool>,
    spot_queue: Option<bool>,
    spot_max_reclaims: Option<u32>,
    spot_max_lost_h: Option<f64>,
    use_lca: Option<bool>,
    owned_at_running_cost: Option<bool>,
}

impl PolicyKeys {
    fn apply(self, p: &mut Policy) {
        let PolicyKeys {
            time_value_usd_per_gpu_hour,
            time_value_usd_per_job_hour,
            carbon_usd_per_kg,
            egress_weight,
            allow_spot,
            spot_queue,
            spot_max_reclaims,
            spot_max_lost_h,
            use_lca,
            owned_at_running_cost,
        } = self;
        let set = |dst: &mut f64, v: Option<f64>| *dst = v.unwrap_or(*dst);
        set(&mut p.time_value_usd_per_gpu_hour, time_value_usd_per_gpu_hour);
        set(&mut p.time_value_usd_per_job_hour, time_value_usd_per_job_hour);
        set(&mut p.carbon_usd_per_kg, carbon_usd_per_kg);
        set(&mut p.egress_weight, egress_weight);
        set(&mut p.spot_max_lost_h, spot_max_lost_h);
        p.allow_spot = allow_spot.unwrap_or(p.allow_spot);
        p.spot_queue = spot_queue.unwrap_or(p.spot_queue);
        p.spot_max_reclaims = spot_max_reclaims.unwrap_or(p.spot_max_reclaims);
        p.use_lca = use_lca.unwrap_or(p.use_lca);
        p.owned_at_running_cost = owned_at_running_cost.unwrap_or(p.owned_at_running_cost);
    }
}

/// The document: only `[policies.*]` is read, so the tables may live in
/// `metasched.toml` beside its other tables.
#[derive(Deserialize)]
struct File {
    #[serde(default)]
    policies: BTreeMap<String, toml::Spanned<PolicyKeys>>,
}

impl Policies {
    pub fn builtin() -> Policies {
        let mut by_name = BTreeMap::new();
        for p in [Policy::cost(), Policy::time(), Policy::green()] {
            by_name.insert(p.name.clone(), p);
        }
        Policies { by_name }
    }

    /// [`Policies::from_toml_named`] for text without a file name.
    pub fn from_toml_str(s: &str) -> Result<Policies, PolicyError> {
        Policies::from_toml_named(s, "<policies>")
    }

    /// Reads `[policies.<name>]` tables from a TOML document (other tables
    /// are ignored, so this can read the whole `metasched.toml`). Unknown
    /// keys inside a policy table and invalid values are errors naming
    /// `file:line:col`.
    pub fn from_toml_named(s: &str, file: &str) -> Result<Policies, PolicyError> {
        let at = |span: Option<std::ops::Range<usize>>, msg: String| {
            let (line, col) = span.map(|r| crate::model::line_col(s, r.start)).unwrap_or((0, 0));
            PolicyError::At { file: file.to_string(), line, col, msg }
        };
        let f: File = toml::from_str(s).map_err(|e| at(e.span(), e.message().trim().to_string()))?;
        let mut out = Policies::builtin();
        for (name, keys) in f.policies {
            let span = keys.span();
            let mut p = out.by_name.get(&name).cloned().unwrap_or_else(Policy::cost);
            keys.into_inner().apply(&mut p);
            p.name = name.clone();
            p.valid().map_err(|msg| at(Some(span), format!("policy {name}: {msg}")))?;
            out.by_name.insert(name, p);
        }
        Ok(out)
    }

    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.by_name.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}
