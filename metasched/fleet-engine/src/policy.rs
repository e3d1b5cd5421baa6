//! Named placement policies and their weights (`[policies.<name>]` in
//! `metasched.toml`; see `conf/metasched-policies.toml`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Weights that turn a candidate's breakdown into one USD score:
/// `total = egress_weight × egress + compute + time_value × GPUs × delay_h
/// + carbon_price × kgCO2`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Filled from the table name.
    #[serde(skip)]
    pub name: String,
    /// USD per GPU-hour of delay (queue wait, transfer, fixed overheads,
    /// work lost to preemption).
    pub time_value_usd_per_gpu_hour: f64,
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
    /// Use life-cycle intensity (`ci_lca`) instead of direct.
    pub use_lca: bool,
}

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
            carbon_usd_per_kg: 0.0,
            egress_weight: 1.0,
            allow_spot: true,
            spot_queue: true,
            use_lca: false,
        }
    }

    /// Shortest completion: delay valued at 20 USD per GPU-hour, no spot.
    pub fn time() -> Policy {
        Policy {
            name: "time".into(),
            time_value_usd_per_gpu_hour: 20.0,
            carbon_usd_per_kg: 0.0,
            egress_weight: 1.0,
            allow_spot: false,
            spot_queue: false,
            use_lca: false,
        }
    }

    /// Cost plus a carbon shadow price of 1 USD/kg (≈ 5× the US EPA 2023
    /// social cost of carbon), so that clean zones win near-ties.
    pub fn green() -> Policy {
        Policy {
            name: "green".into(),
            time_value_usd_per_gpu_hour: 2.0,
            carbon_usd_per_kg: 1.0,
            egress_weight: 1.0,
            allow_spot: true,
            spot_queue: true,
            use_lca: false,
        }
    }

    fn valid(&self) -> Result<(), String> {
        for (k, v) in [
            ("time_value_usd_per_gpu_hour", self.time_value_usd_per_gpu_hour),
            ("carbon_usd_per_kg", self.carbon_usd_per_kg),
            ("egress_weight", self.egress_weight),
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
    #[error("policies TOML: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("policy {name}: {msg}")]
    Invalid { name: String, msg: String },
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

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    policies: BTreeMap<String, toml::Value>,
}

impl Policies {
    pub fn builtin() -> Policies {
        let mut by_name = BTreeMap::new();
        for p in [Policy::cost(), Policy::time(), Policy::green()] {
            by_name.insert(p.name.clone(), p);
        }
        Policies { by_name }
    }

    /// Reads `[policies.<name>]` tables from a TOML document (other tables
    /// are ignored, so this can read the whole `metasched.toml`).
    pub fn from_toml_str(s: &str) -> Result<Policies, PolicyError> {
        let f: File = toml::from_str(s)?;
        let mut out = Policies::builtin();
        for (name, v) in f.policies {
            let base = out.by_name.get(&name).cloned().unwrap_or_else(Policy::cost);
            let mut merged = toml::Value::try_from(&base)
                .map_err(|e| PolicyError::Invalid { name: name.clone(), msg: e.to_string() })?;
            if let (Some(m), Some(over)) = (merged.as_table_mut(), v.as_table()) {
                for (k, x) in over {
                    m.insert(k.clone(), x.clone());
                }
            } else {
                return Err(PolicyError::Invalid { name, msg: "must be a table".into() });
            }
            let mut p: Policy = merged
                .try_into()
                .map_err(|e: toml::de::Error| PolicyError::Invalid { name: name.clone(), msg: e.to_string() })?;
            p.name = name.clone();
            p.valid().map_err(|msg| PolicyError::Invalid { name: name.clone(), msg })?;
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
