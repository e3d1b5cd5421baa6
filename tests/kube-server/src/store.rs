//! The object store: every object as JSON, one resourceVersion counter,
//! and the event log watches read (bounded: a watch from before its start
//! is 410 Gone, as etcd's compaction makes it on a real server).

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Value};

/// Events kept for watches; older resourceVersions are "compacted".
pub const MAX_EVENTS: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Node,
    Pod,
    Job,
    ConfigMap,
    Secret,
    Service,
    Event,
    Namespace,
    ServiceAccount,
    Role,
    RoleBinding,
    ClusterRole,
    ClusterRoleBinding,
    ResourceQuota,
}

pub const KINDS: [Kind; 14] = [
    Kind::Node,
    Kind::Pod,
    Kind::Job,
    Kind::ConfigMap,
    Kind::Secret,
    Kind::Service,
    Kind::Event,
    Kind::Namespace,
    Kind::ServiceAccount,
    Kind::Role,
    Kind::RoleBinding,
    Kind::ClusterRole,
    Kind::ClusterRoleBinding,
    Kind::ResourceQuota,
];

/// The API group of RBAC's kinds.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Node => "nodes",
            Kind::Pod => "pods",
            Kind::Job => "jobs",
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
            Kind::Service => "services",
            Kind::Event => "events",
            Kind::Namespace => "namespaces",
            Kind::ServiceAccount => "serviceaccounts",
            Kind::Role => "roles",
            Kind::RoleBinding => "rolebindings",
            Kind::ClusterRole => "clusterroles",
            Kind::ClusterRoleBinding => "clusterrolebindings",
            Kind::ResourceQuota => "resourcequotas",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "Node",
            Kind::Pod => "Pod",
            Kind::Job => "Job",
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::Event => "Event",
            Kind::Namespace => "Namespace",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Role => "Role",
            Kind::RoleBinding => "RoleBinding",
            Kind::ClusterRole => "ClusterRole",
            Kind::ClusterRoleBinding => "ClusterRoleBinding",
            Kind::ResourceQuota => "ResourceQuota",
        }
    }
    pub fn singular(self) -> String {
        self.name().to_ascii_lowercase()
    }
    pub fn group(self) -> &'static str {
        match self {
            Kind::Job => "batch",
            Kind::Role | Kind::RoleBinding | Kind::ClusterRole | Kind::ClusterRoleBinding => RBAC_GROUP,
            _ => "",
        }
    }
    pub fn api_version(self) -> &'static str {
        match self.group() {
            "batch" => "batch/v1",
            "" => "v1",
            _ => "rbac.authorization.k8s.io/v1",
        }
    }
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Node | Kind::Namespace | Kind::ClusterRole | Kind::ClusterRoleBinding)
    }
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Node => &["no"],
            Kind::Pod => &["po"],
            Kind::ConfigMap => &["cm"],
            Kind::Service => &["svc"],
            Kind::Event => &["ev"],
            Kind::Namespace => &["ns"],
            Kind::ServiceAccount => &["sa"],
            Kind::ResourceQuota => &["quota"],
            _ => &[],
        }
    }
    /// `jobs.batch`, `pods`: how Status messages name a resource.
    pub fn qualified(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }
    pub fn from_path(group: &str, plural: &str) -> Option<Kind> {
        KINDS.into_iter().find(|k| k.group() == group && k.plural() == plural)
    }
}

pub type Key = (Kind, String, String);

#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: Kind,
    pub ns: String,
    pub typ: &'static str,
    pub obj: Value,
    /// The object before a MODIFIED event: a watch whose selector matched
    /// it but not the new version sees DELETED, one that matches only the
    /// new version sees ADDED (as the API server does for field selectors).
    pub prev: Option<Value>,
}

#[derive(Default)]
pub struct Store {
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
    pub events: VecDeque<Event>,
    /// Watches must start at or after this resourceVersion.
    pub oldest: u64,
    pub uid_seq: u64,
    /// Pod uids whose processes the controller must stop (deadline, backoff).
    pub to_kill: Vec<String>,
    /// Bumped by every change of a Pod or Node (what frees or takes capacity).
    pub cap_epoch: u64,
    /// Suspended Job uid -> the `cap_epoch` its admission last failed at.
    pub admit_tried: std::collections::HashMap<String, u64>,
    /// Job uid -> its failed pods that are gone from the store (evicted
    /// pods, deleted once counted): the Job controller's tally, which a
    /// real one keeps with the `batch.kubernetes.io/job-tracking` finalizer.
    pub counted_failed: std::collections::HashMap<String, std::collections::BTreeSet<String>>,
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

impl Store {
    pub fn new_uid(&mut self) -> String {
        self.uid_seq += 1;
        let n = self.uid_seq;
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            n.wrapping_mul(2654435761) as u32,
            n & 0xffff,
            n % 4096,
            (n / 4096) % 4096,
            n
        )
    }

    /// Stores `obj` (ADDED or MODIFIED) with a new resourceVersion.
    pub fn put(&mut self, kind: Kind, mut obj: Value) -> Value {
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        obj["kind"] = json!(kind.name());
        obj["apiVersion"] = json!(kind.api_version());
        let ns = meta_str(&obj, "namespace").to_string();
        let name = meta_str(&obj, "name").to_string();
        let key = (kind, ns.clone(), name);
        let prev = self.objects.insert(key, obj.clone());
        let typ = if prev.is_some() { "MODIFIED" } else { "ADDED" };
        self.log(kind, ns, typ, obj.clone(), prev);
        obj
    }

    pub fn remove(&mut self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        let mut obj = self.objects.remove(&(kind, ns.to_string(), name.to_string()))?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.log(kind, ns.to_string(), "DELETED", obj.clone(), None);
        Some(obj)
    }

    fn log(&mut self, kind: Kind, ns: String, typ: &'static str, obj: Value, prev: Option<Value>) {
        if matches!(kind, Kind::Pod | Kind::Node) {
            self.cap_epoch += 1;
        }
        self.events.push_back(Event { rv: self.rv, kind, ns, typ, obj, prev });
        while self.events.len() > MAX_EVENTS {
            if let Some(e) = self.events.pop_front() {
                self.oldest = e.rv;
            }
        }
    }

    /// Forgets every event: a watch from any resourceVersion given out so
    /// far gets 410 Gone (a list after it returns the new, valid one).
    pub fn compact(&mut self) {
        self.events.clear();
        self.rv += 1;
        self.oldest = self.rv;
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(kind, ns.to_string(), name.to_string()))
    }

    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Vec<&Value> {
        self.objects
            .range((kind, String::new(), String::new())..)
            .take_while(|((k, _, _), _)| *k == kind)
            .filter(|((_, n, _), _)| ns.is_none_or(|want| n == want))
            .map(|(_, v)| v)
            .collect()
    }
}

/// One term of a label selector.
#[derive(Debug, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed label or field selector (`a=b,c!=d,e in (x,y),!f`).
#[derive(Debug, Default)]
pub struct Selector(Vec<Req>);

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut reqs = Vec::new();
        let mut rest = s.trim();
        while !rest.is_empty() {
            // Split at the next comma outside parentheses.
            let mut depth = 0;
            let mut end = rest.len();
            for (i, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let term = rest[..end].trim();
            rest = rest.get(end + 1..).unwrap_or("").trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(Self::term(term)?);
        }
        Ok(Selector(reqs))
    }

    fn term(t: &str) -> Result<Req, String> {
        let set = |v: &str| -> Result<Vec<String>, String> {
            let v = v.trim();
            let inner = v.strip_prefix('(').and_then(|v| v.strip_suffix(')')).ok_or(format!("bad set {v:?}"))?;
            Ok(inner.split(',').map(|x| x.trim().to_string()).collect())
        };
        if let Some(k) = t.strip_prefix('!') {
            return Ok(Req::Absent(k.trim().to_string()));
        }
        if let Some((k, v)) = t.split_once("!=") {
            return Ok(Req::Ne(k.trim().into(), v.trim().into()));
        }
        if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            return Ok(Req::Eq(k.trim().into(), v.trim().into()));
        }
        if let Some((k, v)) = t.split_once(" notin ") {
            return Ok(Req::NotIn(k.trim().into(), set(v)?));
        }
        if let Some((k, v)) = t.split_once(" in ") {
            return Ok(Req::In(k.trim().into(), set(v)?));
        }
        if t.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
            return Ok(Req::Exists(t.to_string()));
        }
        Err(format!("unable to parse requirement: {t:?}"))
    }

    /// Against labels: `get(key)` is the label's value.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k).as_deref() == Some(v),
            Req::Ne(k, v) => get(k).as_deref() != Some(v),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Req::Exists(k) => get(k).is_some(),
            Req::Absent(k) => get(k).is_none(),
        })
    }

    pub fn labels_match(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches(|k| labels[k].as_str().map(str::to_string))
    }

    /// Field selectors: a dotted path into the object.
    pub fn fields_match(&self, obj: &Value) -> bool {
        self.matches(|path| {
            let mut v = obj;
            for part in path.split('.') {
                v = &v[part];
            }
            match v {
                Value::String(s) => Some(s.clone()),
                Value::Null => Some(String::new()),
                other => Some(other.to_string()),
            }
        })
    }
}

/// RFC 3339 UTC time of `secs` since the epoch.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Seconds since the epoch of an RFC 3339 UTC time written by [`rfc3339`].
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + hh * 3600 + mm * 60 + ss)
}

pub fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// A Kubernetes quantity in base units (`500m` = 0.5, `1Gi` = 2^30).
pub fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+')).unwrap_or(s.len());
    let (num, suf) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suf {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    Some(n * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let obj = json!({"metadata": {"name": "a", "labels": {"app": "x", "tier": "gpu"}}, "spec": {"nodeName": "n1"}});
        for (sel, want) in [
            ("app=x", true),
            ("app==x,tier=gpu", true),
            ("app!=x", false),
            ("app in (y, x)", true),
            ("tier notin (gpu)", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("", true),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().labels_match(&obj), want, "{sel}");
        }
        assert!(Selector::parse("spec.nodeName=n1,metadata.name=a").unwrap().fields_match(&obj));
        assert!(!Selector::parse("spec.nodeName=n2").unwrap().fields_match(&obj));
        assert!(Selector::parse("a in b").is_err());
        assert!(Selector::parse("a b").is_err());
    }

    #[test]
    fn times_round_trip() {
        for t in [0, 951782400, 1796147249, 4102444800] {
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t), "{}", rfc3339(t));
        }
        assert_eq!(rfc3339(951782400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1Gi"), Some(1073741824.0));
        assert_eq!(quantity("4G"), Some(4e9));
        assert_eq!(quantity("x"), None);
        assert_eq!(quantity("1Zi"), None);
    }
}
