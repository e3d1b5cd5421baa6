//! Feed parsers: GPU price tables, carbon-intensity series, egress matrices.
//!
//! They take text (the caller reads files), never panic, and report the
//! first bad row with its 1-based line number. A reload builds a new
//! immutable snapshot (e.g. [`crate::FleetModel::with_prices`] wrapped in an
//! `Arc`) that the caller swaps in.
//!
//! The CSV dialect is the plain one these files use: comma separated, no
//! quoting, optional trailing `\r`.

use std::collections::BTreeMap;
use std::io::Read;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct FeedError {
    pub line: usize,
    pub msg: String,
}

fn ferr(line: usize, msg: impl Into<String>) -> FeedError {
    FeedError { line, msg: msg.into() }
}

/// Reads a whole `Read` into a string (for callers holding a reader).
pub fn read_to_string(mut r: impl Read) -> Result<String, FeedError> {
    let mut s = String::new();
    r.read_to_string(&mut s).map_err(|e| ferr(0, format!("read: {e}")))?;
    Ok(s)
}

fn lines(s: &str) -> impl Iterator<Item = (usize, &str)> {
    s.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
}

fn opt_price(field: &str, line: usize, what: &str) -> Result<Option<f64>, FeedError> {
    let f = field.trim();
    if f.is_empty() {
        return Ok(None);
    }
    match f.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
        _ => Err(ferr(line, format!("{what}: bad price {f:?}"))),
    }
}

// ---------------------------------------------------------------------------
// Prices
// ---------------------------------------------------------------------------

/// Per-GPU-hour prices for one (provider, region, GPU type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriceEntry {
    /// Cheapest on-demand USD per GPU-hour over the matching rows.
    pub on_demand: Option<f64>,
    /// Cheapest spot USD per GPU-hour over the matching rows.
    pub spot: Option<f64>,
    /// CSV line the on-demand price came from (0 if none).
    pub on_demand_line: usize,
    /// CSV line the spot price came from (0 if none).
    pub spot_line: usize,
    /// GCP rows: the price covers the accelerator only, not the host VM.
    pub accelerator_only: bool,
}

/// Parsed `gpu-prices.csv`: keyed by (provider, region, GPU type, GPUs per
/// instance), types normalized to upper case.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriceTable {
    pub entries: BTreeMap<(String, String, String, u32), PriceEntry>,
    /// Rows skipped because they sell a fraction of a GPU (gpu_count < 1).
    pub skipped_fractional: usize,
}

impl PriceTable {
    /// The prices of instances with exactly `gpus_per_instance` GPUs (an
    /// 8-GPU node is priced from 8-GPU instances), else the cheapest
    /// per-GPU prices over all instance sizes.
    pub fn get(&self, provider: &str, region: &str, gpu_type: &str, gpus_per_instance: u32) -> Option<PriceEntry> {
        let t = crate::model::normalize_gpu_type(gpu_type);
        let key = (provider.to_string(), region.to_string(), t.clone(), gpus_per_instance);
        if let Some(e) = self.entries.get(&key) {
            return Some(*e);
        }
        let lo = (provider.to_string(), region.to_string(), t.clone(), 0);
        let hi = (provider.to_string(), region.to_string(), t, u32::MAX);
        let mut out: Option<PriceEntry> = None;
        for e in self.entries.range(lo..=hi).map(|(_, e)| e) {
            let o = out.get_or_insert(*e);
            if e.on_demand.is_some_and(|p| o.on_demand.is_none_or(|x| p < x)) {
                o.on_demand = e.on_demand;
                o.on_demand_line = e.on_demand_line;
            }
            if e.spot.is_some_and(|p| o.spot.is_none_or(|x| p < x)) {
                o.spot = e.spot;
                o.spot_line = e.spot_line;
            }
        }
        out
    }
}

/// The exact header of `gpu-prices.csv`.
pub const PRICES_HEADER: &str =
    "provider,region,zone,instance_type,gpu_type,gpu_count,vcpus,memory_gib,price_ondemand_usd_hr,price_spot_usd_hr";

/// Parses the price table. Each row's instance price is divided by its
/// `gpu_count`; per (provider, region, type, GPUs per instance) the cheapest per-GPU on-demand and spot prices
/// are kept (with their line numbers). Rows selling a fraction of a GPU
/// are counted and skipped. GCP rows are accelerator-only (the host VM is
/// priced separately upstream) and are marked so; see `docs/placement.md`.
pub fn parse_prices(text: &str) -> Result<PriceTable, FeedError> {
    let mut it = lines(text);
    match it.next() {
        Some((_, h)) if h.trim() == PRICES_HEADER => {}
        Some((n, h)) => return Err(ferr(n, format!("expected header {PRICES_HEADER:?}, got {h:?}"))),
        None => return Err(ferr(1, "empty price table")),
    }
    let mut t = PriceTable::default();
    for (n, l) in it {
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(',').collect();
        if f.len() != 10 {
            return Err(ferr(n, format!("expected 10 fields, got {}", f.len())));
        }
        let (provider, region, gpu_type) = (f[0].trim(), f[1].trim(), f[4].trim());
        if provider.is_empty() || region.is_empty() || gpu_type.is_empty() {
            return Err(ferr(n, "provider, region and gpu_type are required"));
        }
        let count: f64 = match f[5].trim().parse::<f64>() {
            Ok(c) if c.is_finite() && c > 0.0 => c,
            _ => return Err(ferr(n, format!("bad gpu_count {:?}", f[5]))),
        };
        let od = opt_price(f[8], n, "price_ondemand_usd_hr")?;
        let spot = opt_price(f[9], n, "price_spot_usd_hr")?;
        if count < 1.0 {
            t.skipped_fractional += 1;
            continue;
        }
        let key = (provider.to_string(), region.to_string(), crate::model::normalize_gpu_type(gpu_type), count as u32);
        let e = t.entries.entry(key).or_insert(PriceEntry {
            on_demand: None,
            spot: None,
            on_demand_line: 0,
            spot_line: 0,
            accelerator_only: provider == "gcp",
        });
        if let Some(p) = od.map(|p| p / count) {
            if e.on_demand.is_none_or(|x| p < x) {
                e.on_demand = Some(p);
                e.on_demand_line = n;
            }
        }
        if let Some(p) = spot.map(|p| p / count) {
            if e.spot.is_none_or(|x| p < x) {
                e.spot = Some(p);
                e.spot_line = n;
            }
        }
    }
    Ok(t)
}

// ---------------------------------------------------------------------------
// Carbon
// ---------------------------------------------------------------------------

/// An evenly spaced carbon-intensity series for one zone, with prefix sums
/// for O(1) window means.
#[derive(Clone, Debug, PartialEq)]
pub struct CarbonSeries {
    pub zone: String,
    pub start_unix: f64,
    pub step_s: f64,
    pub direct: Vec<f64>,
    pub lca: Vec<f64>,
    prefix_direct: Vec<f64>,
    prefix_lca: Vec<f64>,
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) to Unix seconds.
pub fn parse_datetime_utc(s: &str) -> Option<f64> {
    let s = s.trim();
    let (d, t) = s.split_once(' ').or_else(|| s.split_once('T'))?;
    let mut dp = d.split('-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: i64 = dp.next()?.parse().ok()?;
    let day: i64 = dp.next()?.parse().ok()?;
    if dp.next().is_some() || !(0..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut tp = t.trim_end_matches('Z').split(':');
    let hh: i64 = tp.next()?.parse().ok()?;
    let mm: i64 = tp.next()?.parse().ok()?;
    let ss: f64 = tp.next().unwrap_or("0").parse().ok()?;
    if !(0..24).contains(&hh) || !(0..60).contains(&mm) || !(0.0..61.0).contains(&ss) {
        return None;
    }
    // Days from civil (H. Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some((days * 86400 + hh * 3600 + mm * 60) as f64 + ss)
}

/// The exact header of the carbon series files.
pub const CARBON_HEADER: &str = "datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh";

/// Parses one zone's series. Rows must be evenly spaced, in order, and
/// all of one zone.
pub fn parse_carbon(text: &str) -> Result<CarbonSeries, FeedError> {
    let mut it = lines(text);
    match it.next() {
        Some((_, h)) if h.trim() == CARBON_HEADER => {}
        Some((n, h)) => return Err(ferr(n, format!("expected header {CARBON_HEADER:?}, got {h:?}"))),
        None => return Err(ferr(1, "empty carbon series")),
    }
    let mut zone: Option<String> = None;
    let (mut start, mut step, mut prev) = (0.0, 0.0, 0.0);
    let (mut direct, mut lca) = (Vec::new(), Vec::new());
    for (n, l) in it {
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(',').collect();
        if f.len() != 4 {
            return Err(ferr(n, format!("expected 4 fields, got {}", f.len())));
        }
        let t = parse_datetime_utc(f[0]).ok_or_else(|| ferr(n, format!("bad datetime {:?}", f[0])))?;
        let z = f[1].trim();
        match &zone {
            None => zone = Some(z.to_string()),
            Some(zz) if zz != z => return Err(ferr(n, format!("zone {z:?} differs from {zz:?}"))),
            _ => {}
        }
        let num = |s: &str, what: &str| match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(ferr(n, format!("{what}: bad value {s:?}"))),
        };
        let d = num(f[2], "ci_direct_gco2_kwh")?;
        let c = num(f[3], "ci_lca_gco2_kwh")?;
        match direct.len() {
            0 => start = t,
            1 => {
                step = t - start;
                if step <= 0.0 {
                    return Err(ferr(n, "timestamps must increase"));
                }
            }
            _ => {
                if (t - prev - step).abs() > 0.5 {
                    return Err(ferr(n, format!("gap or step change: expected {} s after the previous row", step)));
                }
            }
        }
        prev = t;
        direct.push(d);
        lca.push(c);
    }
    let Some(zone) = zone else {
        return Err(ferr(2, "no rows"));
    };
    if direct.len() == 1 {
        step = 3600.0;
    }
    Ok(CarbonSeries::new(zone, start, step, direct, lca))
}

fn prefix(v: &[f64]) -> Vec<f64> {
    let mut p = Vec::with_capacity(v.len() + 1);
    let mut acc = 0.0;
    p.push(0.0);
    for x in v {
        acc += x;
        p.push(acc);
    }
    p
}

impl CarbonSeries {
    /// A series from values; `step_s` must be > 0 (else 3600 is used).
    pub fn new(zone: String, start_unix: f64, step_s: f64, direct: Vec<f64>, lca: Vec<f64>) -> CarbonSeries {
        let step_s = if step_s.is_finite() && step_s > 0.0 { step_s } else { 3600.0 };
        let mut lca = lca;
        lca.resize(direct.len(), 0.0);
        CarbonSeries { prefix_direct: prefix(&direct), prefix_lca: prefix(&lca), zone, start_unix, step_s, direct, lca }
    }

    pub fn len(&self) -> usize {
        self.direct.len()
    }

    pub fn is_empty(&self) -> bool {
        self.direct.is_empty()
    }

    /// Integral of the step function from the series start to `x` seconds
    /// later, the series repeating itself (a 2023 series serves any year).
    fn integral(&self, x: f64, lca: bool) -> f64 {
        let (p, v) = if lca { (&self.prefix_lca, &self.lca) } else { (&self.prefix_direct, &self.direct) };
        let n = v.len();
        if n == 0 {
            return 0.0;
        }
        let period = self.step_s * n as f64;
        let total = p[n] * self.step_s;
        let cycles = (x / period).floor();
        let r = x - cycles * period;
        let idx = ((r / self.step_s).floor() as usize).min(n - 1);
        let within = r - idx as f64 * self.step_s;
        cycles * total + p[idx] * self.step_s + v[idx] * within
    }

    /// Mean intensity (gCO2/kWh) over `[t0, t1)` Unix seconds; at `t0`
    /// when the window is empty. Times outside the series wrap around.
    pub fn mean_between(&self, t0: f64, t1: f64, lca: bool) -> f64 {
        if self.is_empty() || !t0.is_finite() || !t1.is_finite() {
            return 0.0;
        }
        let a = t0 - self.start_unix;
        if t1 - t0 < 1.0 {
            return self.integral(a + 1.0, lca) - self.integral(a, lca);
        }
        let b = t1 - self.start_unix;
        (self.integral(b, lca) - self.integral(a, lca)) / (b - a)
    }
}

// ---------------------------------------------------------------------------
// Egress
// ---------------------------------------------------------------------------

/// A square egress matrix for one provider (row = source, column = dest).
#[derive(Clone, Debug, PartialEq)]
pub struct EgressMatrix {
    pub provider: String,
    pub regions: Vec<String>,
    pub usd_per_gb: Vec<f64>,
}

impl EgressMatrix {
    pub fn get(&self, from: usize, to: usize) -> Option<f64> {
        let n = self.regions.len();
        if from >= n || to >= n {
            return None;
        }
        self.usd_per_gb.get(from * n + to).copied()
    }

    pub fn lookup(&self, from: &str, to: &str) -> Option<f64> {
        let i = self.regions.iter().position(|r| r == from)?;
        let j = self.regions.iter().position(|r| r == to)?;
        self.get(i, j)
    }
}

/// Parses `<cloud>_transmission_cost_matrix.csv`: first row = empty cell +
/// destination names; each further row = source name + USD/GB per
/// destination. Rows may come in any order but must name each
/// destination exactly once.
pub fn parse_egress(provider: &str, text: &str) -> Result<EgressMatrix, FeedError> {
    let mut it = lines(text);
    let Some((hn, header)) = it.next() else {
        return Err(ferr(1, "empty egress matrix"));
    };
    let cols: Vec<String> = header.split(',').map(|s| s.trim().to_string()).collect();
    if cols.len() < 2 || !cols[0].is_empty() {
        return Err(ferr(hn, "first row must be an empty cell followed by destination names"));
    }
    let regions: Vec<String> = cols[1..].to_vec();
    for (i, r) in regions.iter().enumerate() {
        if r.is_empty() || regions[..i].contains(r) {
            return Err(ferr(hn, format!("empty or repeated region name {r:?}")));
        }
    }
    let n = regions.len();
    let mut m = vec![f64::NAN; n * n];
    let mut seen = vec![false; n];
    for (ln, l) in it {
        if l.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split(',').collect();
        if f.len() != n + 1 {
            return Err(ferr(ln, format!("expected {} fields, got {}", n + 1, f.len())));
        }
        let src = f[0].trim();
        let Some(i) = regions.iter().position(|r| r == src) else {
            return Err(ferr(ln, format!("source {src:?} is not among the destinations")));
        };
        if seen[i] {
            return Err(ferr(ln, format!("source {src:?} repeated")));
        }
        seen[i] = true;
        for (j, v) in f[1..].iter().enumerate() {
            match v.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => m[i * n + j] = x,
                _ => return Err(ferr(ln, format!("column {}: bad USD/GB {v:?}", j + 2))),
            }
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(ferr(text.lines().count() + 1, format!("no row for source {:?}", regions[i])));
    }
    Ok(EgressMatrix { provider: provider.to_string(), regions, usd_per_gb: m })
}
