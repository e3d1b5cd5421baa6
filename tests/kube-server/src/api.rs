//! The HTTP side: discovery, authentication and per-namespace RBAC, REST
//! verbs on the store, watches, pod logs and `Table` output.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use crate::rbac::{self, Attrs, Subject};
use crate::store::{meta_str, now_s, parse_rfc3339, rfc3339, Kind, Selector, Store, KINDS, RBAC_GROUP};
use crate::State;

pub fn router(state: Arc<State>) -> Router {
    Router::new().fallback(handle).with_state(state)
}

fn json_response(code: StatusCode, v: &Value) -> Response {
    (code, [("content-type", "application/json")], serde_json::to_vec(v).unwrap_or_default()).into_response()
}

/// A Kubernetes `Status` failure.
pub fn status(code: u16, reason: &str, message: &str, details: Value) -> Response {
    let v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message, "reason": reason, "details": details, "code": code});
    json_response(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &v)
}

fn not_found(kind: Kind, name: &str) -> Response {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", kind.qualified()),
        json!({"name": name, "group": kind.group(), "kind": kind.plural()}),
    )
}

fn bad_request(msg: &str) -> Response {
    status(400, "BadRequest", msg, json!({}))
}

fn resource_list(group_version: &str, kinds: &[Kind]) -> Value {
    let mut resources = Vec::new();
    for k in kinds {
        let verbs: Vec<&str> = match k {
            Kind::Node => vec!["get", "list", "patch", "update", "watch"],
            Kind::Namespace | Kind::Event => vec!["get", "list", "watch"],
            _ => vec!["create", "delete", "get", "list", "patch", "update", "watch"],
        };
        resources.push(json!({"name": k.plural(), "singularName": k.singular(), "namespaced": k.namespaced(),
            "kind": k.name(), "verbs": verbs, "shortNames": k.short_names(),
            "categories": if matches!(k, Kind::Pod | Kind::Job | Kind::Service) { json!(["all"]) } else { json!([]) }}));
        if *k == Kind::Pod {
            resources.push(
                json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}),
            );
            // As the API server lists it: how `kubectl drain` learns that
            // it may evict (else it deletes).
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
        if matches!(k, Kind::Pod | Kind::Job) {
            resources.push(json!({"name": format!("{}/status", k.plural()), "singularName": "", "namespaced": true,
                "kind": k.name(), "verbs": ["get"]}));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

fn bearer(state: &State, headers: &HeaderMap) -> Option<Subject> {
    let h = headers.get("authorization")?.to_str().ok()?;
    let t = h.strip_prefix("Bearer ")?.trim();
    rbac::authenticate(state, t)
}

/// The API groups served besides the core one: (name, its kinds).
const GROUPS: [(&str, &[Kind]); 3] = [
    ("batch", &[Kind::Job]),
    (RBAC_GROUP, &[Kind::Role, Kind::RoleBinding, Kind::ClusterRole, Kind::ClusterRoleBinding]),
    ("authorization.k8s.io", &[]),
];

fn api_group(name: &str) -> Value {
    let gv = format!("{name}/v1");
    json!({"name": name, "versions": [{"groupVersion": gv, "version": "v1"}],
           "preferredVersion": {"groupVersion": gv, "version": "v1"}})
}

/// The fields of one protobuf message: (field number, bytes of a
/// length-delimited field or a varint's value as bytes); `None` if malformed.
fn proto_fields(mut b: &[u8]) -> Option<Vec<(u64, Vec<u8>)>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&x, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(x & 0x7f) << shift;
            if x & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let val = match key & 7 {
            0 => varint(&mut b)?.to_le_bytes().to_vec(),
            2 => {
                let n = usize::try_from(varint(&mut b)?).ok()?;
                let (v, rest) = (b.get(..n)?, b.get(n..)?);
                b = rest;
                v.to_vec()
            }
            1 => {
                let (v, rest) = (b.get(..8)?, b.get(8..)?);
                b = rest;
                v.to_vec()
            }
            5 => {
                let (v, rest) = (b.get(..4)?, b.get(4..)?);
                b = rest;
                v.to_vec()
            }
            _ => return None,
        };
        out.push((key >> 3, val));
    }
    Some(out)
}

/// A SelfSubjectAccessReview sent as Kubernetes protobuf (`k8s\0`, a
/// `runtime.Unknown` around the object), as `kubectl auth can-i` sends it:
/// its spec as JSON.
fn review_from_protobuf(body: &[u8]) -> Option<Value> {
    let field = |fields: &[(u64, Vec<u8>)], n: u64| fields.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
    let unknown = proto_fields(body.strip_prefix(b"k8s\0")?)?;
    let obj = proto_fields(&field(&unknown, 2)?)?;
    let spec = proto_fields(&field(&obj, 2)?)?;
    let mut out = json!({"spec": {}});
    if let Some(ra) = field(&spec, 1) {
        let ra = proto_fields(&ra)?;
        let mut m = serde_json::Map::new();
        for (n, k) in [
            (1, "namespace"),
            (2, "verb"),
            (3, "group"),
            (4, "version"),
            (5, "resource"),
            (6, "subresource"),
            (7, "name"),
        ] {
            if let Some(v) = field(&ra, n) {
                m.insert(k.into(), json!(String::from_utf8(v).ok()?));
            }
        }
        out["spec"]["resourceAttributes"] = Value::Object(m);
    } else if field(&spec, 2).is_some() {
        out["spec"]["nonResourceAttributes"] = json!({});
    }
    Some(out)
}

/// `kubectl auth can-i`: a SelfSubjectAccessReview answered for its caller
/// (JSON, or the protobuf kubectl sends; answered in JSON, which client-go
/// decodes by the reply's content type).
fn access_review(state: &State, who: &Subject, body: &[u8], protobuf: bool) -> Response {
    let parsed = if protobuf { review_from_protobuf(body) } else { serde_json::from_slice::<Value>(body).ok() };
    let Some(mut review) = parsed else {
        return bad_request("the body of the request was not a SelfSubjectAccessReview");
    };
    let ra = review["spec"]["resourceAttributes"].clone();
    let allowed = if ra.is_object() {
        let s = |k: &str| ra[k].as_str().filter(|v| !v.is_empty());
        let resource = match s("subresource") {
            Some(sub) => format!("{}/{sub}", s("resource").unwrap_or("")),
            None => s("resource").unwrap_or("").to_string(),
        };
        let a = Attrs {
            verb: s("verb").unwrap_or(""),
            group: s("group").unwrap_or(""),
            resource: &resource,
            ns: s("namespace"),
            name: s("name"),
        };
        rbac::allows(&state.store.lock(), who, &a)
    } else {
        // Non-resource URLs: the cluster admin's alone here.
        who.table.as_ref().is_some_and(|t| t.namespaces.iter().any(|n| n == "*"))
    };
    review["status"] = json!({"allowed": allowed});
    review["kind"] = json!("SelfSubjectAccessReview");
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    json_response(StatusCode::CREATED, &review)
}

/// What a request addresses.
struct Target {
    kind: Kind,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", "batch", "v1", rest @ ..] => ("batch", rest),
        ["apis", RBAC_GROUP, "v1", rest @ ..] => (RBAC_GROUP, rest),
        _ => return None,
    };
    let own = |s: &&str| s.to_string();
    let (ns, kind, name, sub) = match rest {
        ["namespaces", ns, res, rest @ ..] => {
            (Some(ns.to_string()), Kind::from_path(group, res)?, rest.first().map(own), rest.get(1).map(own))
        }
        [res, rest @ ..] => (None, Kind::from_path(group, res)?, rest.first().map(own), rest.get(1).map(own)),
        _ => return None,
    };
    Some(Target { kind, ns, name, sub })
}

async fn handle(
    AxState(state): AxState<Arc<State>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let q: HashMap<String, String> = Query::try_from_uri(&uri).map(|Query(q)| q).unwrap_or_default();
    let path = uri.path().trim_end_matches('/');
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some(tok) = bearer(&state, &headers) else {
        return status(401, "Unauthorized", "Unauthorized", json!({}));
    };
    // Discovery: any authenticated user (system:discovery).
    match segs.as_slice() {
        ["version"] => {
            return json_response(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fleet-test", "gitCommit": "", "gitTreeState": "clean",
                        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
            )
        }
        ["api"] => {
            return json_response(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.url.split("://").nth(1).unwrap_or("")}]}),
            )
        }
        ["apis"] => {
            let groups: Vec<Value> = GROUPS.iter().map(|(g, _)| api_group(g)).collect();
            return json_response(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            );
        }
        ["apis", g] if GROUPS.iter().any(|(n, _)| n == g) => {
            let mut v = api_group(g);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            return json_response(StatusCode::OK, &v);
        }
        ["apis", "authorization.k8s.io", "v1"] => {
            return json_response(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "authorization.k8s.io/v1",
                        "resources": [{"name": "selfsubjectaccessreviews", "singularName": "selfsubjectaccessreview",
                                       "namespaced": false, "kind": "SelfSubjectAccessReview", "verbs": ["create"]}]}),
            )
        }
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] if method == Method::POST => {
            let protobuf = headers
                .get("content-type")
                .and_then(|c| c.to_str().ok())
                .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
            return access_review(&state, &tok, &body, protobuf);
        }
        ["apis", g, "v1"] if GROUPS.iter().any(|(n, _)| n == g) => {
            let kinds = GROUPS.iter().find(|(n, _)| n == g).map(|(_, k)| *k).unwrap_or(&[]);
            return json_response(StatusCode::OK, &resource_list(&format!("{g}/v1"), kinds));
        }
        ["api", "v1"] => {
            let core: Vec<Kind> = KINDS.into_iter().filter(|k| k.group().is_empty()).collect();
            return json_response(StatusCode::OK, &resource_list("v1", &core));
        }
        _ => {}
    }
    let Some(t) = parse_target(&segs) else {
        return status(404, "NotFound", "the server could not find the requested resource", json!({}));
    };
    let verb = match (&method, t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return status(405, "MethodNotAllowed", "method not allowed", json!({})),
    };
    // Authorization (crate::rbac): a configured token by its table, a
    // ServiceAccount by its Roles and ClusterRoles.
    let res = match &t.sub {
        Some(s) => format!("{}/{s}", t.kind.plural()),
        None => t.kind.plural().to_string(),
    };
    let allowed = {
        let a = Attrs { verb, group: t.kind.group(), resource: &res, ns: t.ns.as_deref(), name: t.name.as_deref() };
        rbac::allows(&state.store.lock(), &tok, &a)
    };
    if !allowed {
        let scope = match (&t.ns, t.kind.namespaced()) {
            (Some(ns), _) => format!("in the namespace \"{ns}\""),
            _ => "at the cluster scope".into(),
        };
        let what = match &t.name {
            Some(n) => format!("{} \"{n}\"", t.kind.qualified()),
            None => t.kind.qualified(),
        };
        return status(
            403,
            "Forbidden",
            &format!(
                "{what} is forbidden: User \"{}\" cannot {verb} resource \"{res}\" in API group \"{}\" {scope}",
                tok.user,
                t.kind.group()
            ),
            json!({"name": t.name.clone().unwrap_or_default(), "group": t.kind.group(), "kind": t.kind.plural()}),
        );
    }
    if t.kind.namespaced() && t.ns.is_none() && !matches!(verb, "list" | "watch") {
        return status(404, "NotFound", "the server could not find the requested resource", json!({}));
    }
    let ns = t.ns.clone().unwrap_or_default();
    if t.kind == Kind::Pod && t.sub.as_deref() == Some("eviction") {
        if verb != "create" {
            return status(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                json!({}),
            );
        }
        return evict(&state, &ns, t.name.as_deref().unwrap_or(""), &body);
    }
    match verb {
        "get" => {
            let name = t.name.clone().unwrap_or_default();
            if t.kind == Kind::Pod && t.sub.as_deref() == Some("log") {
                return pod_log(&state, &ns, &name, &q).await;
            }
            let obj = state.store.lock().get(t.kind, &ns, &name).cloned();
            match obj {
                Some(o) if wants_table(&headers) => {
                    json_response(StatusCode::OK, &table(t.kind, &[o], state.store.lock().rv))
                }
                Some(o) => json_response(StatusCode::OK, &o),
                None => not_found(t.kind, &name),
            }
        }
        "list" => {
            if t.kind == Kind::Pod {
                state.pod_lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            list(&state, &t, &q, &headers)
        }
        "watch" => watch(state.clone(), t, q),
        "create" => create(&state, &t, &body, &q),
        "update" => update(&state, &t, &body, false),
        "patch" => update(&state, &t, &body, true),
        "delete" => delete(&state, &t, &body, &q),
        _ => status(405, "MethodNotAllowed", "deletecollection is not served", json!({})),
    }
}

/// The label and field selectors of a request, or the 400 that says which is bad.
fn selectors(q: &HashMap<String, String>) -> Result<(Selector, Selector), Box<Response>> {
    let l =
        Selector::parse(q.get("labelSelector").map_or("", String::as_str)).map_err(|e| Box::new(bad_request(&e)))?;
    let f =
        Selector::parse(q.get("fieldSelector").map_or("", String::as_str)).map_err(|e| Box::new(bad_request(&e)))?;
    Ok((l, f))
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers.get("accept").and_then(|a| a.to_str().ok()).is_some_and(|a| a.contains("as=Table"))
}

fn list(state: &State, t: &Target, q: &HashMap<String, String>, headers: &HeaderMap) -> Response {
    let (l, f) = match selectors(q) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let st = state.store.lock();
    let items: Vec<Value> = st
        .list(t.kind, t.ns.as_deref())
        .into_iter()
        .filter(|o| l.labels_match(o) && f.fields_match(o))
        .cloned()
        .collect();
    if wants_table(headers) {
        return json_response(StatusCode::OK, &table(t.kind, &items, st.rv));
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.kind.name()), "apiVersion": t.kind.api_version(),
                "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
    )
}

fn watch_event(typ: &str, obj: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": typ, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn watch(state: Arc<State>, t: Target, q: HashMap<String, String>) -> Response {
    let (l, f) = match selectors(&q) {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let timeout = q.get("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()).unwrap_or(1800);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let kind = t.kind;
    let ns = t.ns.clone();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let mut changed = state.changed.subscribe();
        let mut resets = state.resets.subscribe();
        let matches = |o: &Value| l.labels_match(o) && f.fields_match(o);
        // The start, under the store lock (released before any send).
        let first: Result<(u64, Vec<Bytes>), Value> = {
            let st = state.store.lock();
            if initial || rv_param.is_empty() || rv_param == "0" {
                let mut lines: Vec<Bytes> = st
                    .list(kind, ns.as_deref())
                    .into_iter()
                    .filter(|o| matches(o))
                    .map(|o| watch_event("ADDED", o))
                    .collect();
                if initial {
                    lines.push(watch_event(
                        "BOOKMARK",
                        &json!({"kind": kind.name(), "apiVersion": kind.api_version(),
                                "metadata": {"resourceVersion": st.rv.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}),
                    ));
                }
                Ok((st.rv, lines))
            } else {
                rv_param.parse::<u64>().map(|rv| (rv, Vec::new())).map_err(|_| expired(&rv_param, st.oldest))
            }
        };
        let mut cursor = match first {
            Ok((rv, lines)) => {
                for b in lines {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                rv
            }
            Err(st) => {
                state.gone.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = tx.send(watch_event("ERROR", &st)).await;
                return;
            }
        };
        let mut last_sent = tokio::time::Instant::now();
        loop {
            let batch: Result<Vec<Bytes>, Value> = {
                let st = state.store.lock();
                if cursor < st.oldest {
                    Err(expired(&cursor.to_string(), st.oldest))
                } else {
                    let start = st.events.partition_point(|e| e.rv <= cursor);
                    let mut out = Vec::new();
                    for e in st.events.range(start..) {
                        cursor = e.rv;
                        if e.kind != kind || ns.as_ref().is_some_and(|n| *n != e.ns) {
                            continue;
                        }
                        let was = e.prev.as_ref().map(&matches);
                        match (matches(&e.obj), was) {
                            (true, Some(false)) => out.push(watch_event("ADDED", &e.obj)),
                            (true, _) => out.push(watch_event(e.typ, &e.obj)),
                            // It left the selection (a pod that finished,
                            // under a phase selector): gone for this watch.
                            (false, Some(true)) => out.push(watch_event("DELETED", &e.obj)),
                            (false, _) => {}
                        }
                    }
                    cursor = cursor.max(st.rv);
                    Ok(out)
                }
            };
            match batch {
                Err(status) => {
                    state.gone.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let _ = tx.send(watch_event("ERROR", &status)).await;
                    return;
                }
                Ok(lines) => {
                    let late = state.cfg.pod_watch_delay;
                    if kind == Kind::Pod && !lines.is_empty() && !late.is_zero() {
                        tokio::time::sleep(late).await;
                    }
                    if !lines.is_empty() {
                        last_sent = tokio::time::Instant::now();
                    }
                    for b in lines {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let every = state.cfg.bookmark_every;
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = tokio::time::sleep_until(last_sent + every) => {
                    if bookmarks {
                        let b = watch_event("BOOKMARK", &json!({"kind": kind.name(), "apiVersion": kind.api_version(),
                                                                "metadata": {"resourceVersion": cursor.to_string()}}));
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    } else if tx.is_closed() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
                _ = tokio::time::sleep_until(deadline) => return,
                _ = resets.changed() => return,
            }
        }
    });
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx)) },
        );
    (StatusCode::OK, [("content-type", "application/json")], Body::from_stream(stream)).into_response()
}

fn expired(rv: &str, oldest: u64) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("too old resource version: {rv} ({oldest})"), "reason": "Expired", "code": 410})
}

fn valid_name(kind: Kind, name: &str) -> bool {
    let max = if matches!(kind, Kind::Service | Kind::Namespace) { 63 } else { 253 };
    !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

fn invalid(kind: Kind, name: &str, msg: &str) -> Response {
    status(
        422,
        "Invalid",
        &format!("{} \"{name}\" is invalid: {msg}", kind.name()),
        json!({"name": name, "group": kind.group(), "kind": kind.name()}),
    )
}

fn create(state: &Arc<State>, t: &Target, body: &[u8], q: &HashMap<String, String>) -> Response {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return bad_request("the body of the request was not a JSON object"),
    };
    if obj["kind"].as_str().is_some_and(|k| k != t.kind.name()) {
        return bad_request(&format!("the API version in the data does not match the expected kind {}", t.kind.name()));
    }
    let ns = t.ns.clone().unwrap_or_default();
    if t.kind.namespaced() {
        match obj["metadata"]["namespace"].as_str() {
            Some(n) if n != ns => {
                return bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            }
            _ => obj["metadata"]["namespace"] = json!(ns),
        }
    }
    let mut st = state.store.lock();
    let name = match (obj["metadata"]["name"].as_str(), obj["metadata"]["generateName"].as_str()) {
        (Some(n), _) if !n.is_empty() => n.to_string(),
        (_, Some(g)) => {
            let n = format!("{g}{}", &st.new_uid()[..5]);
            obj["metadata"]["name"] = json!(n);
            n
        }
        _ => return invalid(t.kind, "", "metadata.name: Required value: name or generateName is required"),
    };
    if !valid_name(t.kind, &name) {
        return invalid(t.kind, &name, "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'");
    }
    if st.get(t.kind, &ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", t.kind.qualified()),
            json!({"name": name, "group": t.kind.group(), "kind": t.kind.plural()}),
        );
    }
    if let Err(msg) = admit(&mut st, t.kind, &mut obj) {
        return invalid(t.kind, &name, &msg);
    }
    if q.get("dryRun").is_some() {
        return json_response(StatusCode::CREATED, &obj);
    }
    let uid = st.new_uid();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["creationTimestamp"] = json!(rfc3339(now_s()));
    obj["metadata"]["generation"] = json!(1);
    if t.kind == Kind::Job {
        // The Job controller's selector and template labels.
        obj["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
        let labels = &mut obj["spec"]["template"]["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        labels["batch.kubernetes.io/controller-uid"] = json!(uid);
        labels["batch.kubernetes.io/job-name"] = json!(name);
        labels["controller-uid"] = json!(uid);
        labels["job-name"] = json!(name);
    }
    let stored = st.put(t.kind, obj);
    drop(st);
    state.poke();
    json_response(StatusCode::CREATED, &stored)
}

/// Defaults and validation on create (what the API server's admission and
/// defaulting do for the fields the agent uses).
fn admit(st: &mut Store, kind: Kind, obj: &mut Value) -> Result<(), String> {
    use base64::Engine as _;
    match kind {
        Kind::Job => {
            let spec = &mut obj["spec"];
            if spec["template"]["spec"]["containers"].as_array().is_none_or(|c| c.is_empty()) {
                return Err("spec.template.spec.containers: Required value".into());
            }
            match spec["template"]["spec"]["restartPolicy"].as_str() {
                Some("Never" | "OnFailure") => {}
                _ => {
                    return Err(
                        "spec.template.spec.restartPolicy: Required value: valid values: \"OnFailure\", \"Never\""
                            .into(),
                    )
                }
            }
            let indexed = spec["completionMode"] == "Indexed";
            if indexed && spec["completions"].is_null() {
                return Err("spec.completions: Required value: when completion mode is Indexed".into());
            }
            for (k, d) in [
                ("parallelism", json!(1)),
                ("completions", json!(1)),
                ("backoffLimit", json!(6)),
                ("suspend", json!(false)),
            ] {
                if spec[k].is_null() {
                    spec[k] = d;
                }
            }
            if spec["completionMode"].is_null() {
                spec["completionMode"] = json!("NonIndexed");
            }
            obj["status"] = json!({});
        }
        Kind::Secret => {
            if let Some(sd) = obj["stringData"].as_object().cloned() {
                for (k, v) in sd {
                    obj["data"][&k] = json!(base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or("")));
                }
                obj.as_object_mut().map(|o| o.remove("stringData"));
            }
            for (k, v) in obj["data"].as_object().into_iter().flatten() {
                if v.as_str().is_none_or(|s| base64::engine::general_purpose::STANDARD.decode(s).is_err()) {
                    return Err(format!("data[{k}]: Invalid value: not base64"));
                }
            }
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
        }
        Kind::Service => {
            if obj["spec"]["clusterIP"].is_null() {
                let n = st.uid_seq + 1;
                obj["spec"]["clusterIP"] = json!(format!("10.96.{}.{}", (n / 250) % 250, n % 250 + 1));
            }
            if obj["spec"]["type"].is_null() {
                obj["spec"]["type"] = json!("ClusterIP");
            }
        }
        Kind::Pod => {
            obj["status"] = json!({"phase": "Pending"});
        }
        _ => {}
    }
    if kind == Kind::Secret {
        rbac::fill_token(st, obj)?;
    }
    Ok(())
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn update(state: &Arc<State>, t: &Target, body: &[u8], patch: bool) -> Response {
    let Ok(new) = serde_json::from_slice::<Value>(body) else {
        return bad_request("the body of the request was not JSON");
    };
    let ns = t.ns.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let mut st = state.store.lock();
    let Some(cur) = st.get(t.kind, &ns, &name).cloned() else { return not_found(t.kind, &name) };
    let mut next = if patch {
        let mut c = cur.clone();
        merge_patch(&mut c, &new);
        c
    } else {
        if let Some(rv) = new["metadata"]["resourceVersion"].as_str() {
            if rv != meta_str(&cur, "resourceVersion") {
                return status(
                    409,
                    "Conflict",
                    &format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", t.kind.qualified()),
                    json!({"name": name, "group": t.kind.group(), "kind": t.kind.plural()}),
                );
            }
        }
        new
    };
    // Immutable identity; status only through /status.
    for k in ["uid", "creationTimestamp", "name", "namespace"] {
        next["metadata"][k] = cur["metadata"][k].clone();
    }
    if t.sub.as_deref() == Some("status") {
        let mut c = cur.clone();
        c["status"] = next["status"].clone();
        next = c;
    } else if !cur["status"].is_null() {
        next["status"] = cur["status"].clone();
    }
    let stored = st.put(t.kind, next);
    drop(st);
    state.poke();
    json_response(StatusCode::OK, &stored)
}

fn delete(state: &Arc<State>, t: &Target, body: &[u8], q: &HashMap<String, String>) -> Response {
    let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let policy = opts["propagationPolicy"]
        .as_str()
        .map(str::to_string)
        .or_else(|| q.get("propagationPolicy").cloned())
        .or_else(|| opts["orphanDependents"].as_bool().map(|o| if o { "Orphan".into() } else { "Background".into() }))
        // The API's own default for Jobs orphans their pods.
        .unwrap_or_else(|| if t.kind == Kind::Job { "Orphan".into() } else { "Background".into() });
    if !matches!(policy.as_str(), "Orphan" | "Background" | "Foreground") {
        return bad_request(&format!("propagationPolicy: Unsupported value: {policy:?}"));
    }
    let ns = t.ns.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    let mut killed = Vec::new();
    let removed = {
        let mut st = state.store.lock();
        let Some(obj) = st.remove(t.kind, &ns, &name) else { return not_found(t.kind, &name) };
        if t.kind == Kind::Pod {
            killed.push(meta_str(&obj, "uid").to_string());
        }
        let mut queue = vec![meta_str(&obj, "uid").to_string()];
        while let Some(owner) = queue.pop() {
            let dependents: Vec<(Kind, String, String, Value)> = st
                .objects
                .iter()
                .filter(|(_, v)| {
                    v["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|rs| rs.iter().any(|r| r["uid"] == json!(owner)))
                })
                .map(|((k, n, m), v)| (*k, n.clone(), m.clone(), v.clone()))
                .collect();
            for (k, n, m, mut v) in dependents {
                if policy == "Orphan" {
                    let refs: Vec<Value> = v["metadata"]["ownerReferences"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|r| r["uid"] != json!(owner))
                        .cloned()
                        .collect();
                    v["metadata"]["ownerReferences"] = json!(refs);
                    st.put(k, v);
                } else if let Some(d) = st.remove(k, &n, &m) {
                    if k == Kind::Pod {
                        killed.push(meta_str(&d, "uid").to_string());
                    }
                    queue.push(meta_str(&d, "uid").to_string());
                }
            }
        }
        obj
    };
    for uid in killed {
        crate::kubelet::kill(state, &uid, Duration::from_secs(2));
    }
    state.poke();
    json_response(StatusCode::OK, &removed)
}

/// The Eviction API (`POST .../pods/<name>/eviction`, a `policy/v1`
/// Eviction, what `kubectl drain` sends): no PodDisruptionBudget is
/// served, so every eviction is allowed. As the API server does, the pod
/// gets the `DisruptionTarget` condition (`EvictionByEvictionAPI`) and is
/// deleted gracefully: its container gets SIGTERM, SIGKILL after the grace
/// period (2 s here), the kubelet records its end (phase Failed) and the
/// pod is gone once its Job has counted it (the controller's pass). A pod
/// that has ended already is deleted at once.
fn evict(state: &Arc<State>, ns: &str, name: &str, body: &[u8]) -> Response {
    let ev: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return bad_request("the body of the request was not a JSON object"),
    };
    if ev["kind"] != "Eviction" || !matches!(ev["apiVersion"].as_str(), Some("policy/v1" | "policy/v1beta1")) {
        return bad_request("expected an Eviction of policy/v1");
    }
    if ev["metadata"]["name"].as_str() != Some(name) {
        return bad_request("name in URL does not match name in Eviction object");
    }
    const GRACE_S: i64 = 2;
    let (uid, running) = {
        let mut st = state.store.lock();
        let Some(mut p) = st.get(Kind::Pod, ns, name).cloned() else { return not_found(Kind::Pod, name) };
        let uid = meta_str(&p, "uid").to_string();
        if matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
            st.remove(Kind::Pod, ns, name);
            (uid, false)
        } else {
            let mut conds: Vec<Value> = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["type"] != "DisruptionTarget")
                .cloned()
                .collect();
            conds.push(crate::kubelet::cond(
                "DisruptionTarget",
                "True",
                "EvictionByEvictionAPI",
                "Eviction API: evicting",
            ));
            p["status"]["conditions"] = json!(conds);
            if !p["metadata"]["deletionTimestamp"].is_string() {
                p["metadata"]["deletionTimestamp"] = json!(rfc3339(now_s() + GRACE_S));
                p["metadata"]["deletionGracePeriodSeconds"] = json!(GRACE_S);
            }
            // Running (or starting: the kubelet set Running before it
            // spawned the process): its process is stopped. Otherwise
            // nothing runs: it ends here.
            let running = p["status"]["phase"] == "Running";
            if !running {
                p["status"]["phase"] = json!("Failed");
            }
            st.put(Kind::Pod, p);
            (uid, running)
        }
    };
    if running {
        let state2 = state.clone();
        tokio::spawn(async move {
            // The process may not be there yet (the kubelet spawns it
            // after its pass): wait for it a little.
            for _ in 0..50 {
                if state2.procs.lock().contains_key(&uid) {
                    crate::kubelet::kill(&state2, &uid, Duration::from_secs(GRACE_S as u64));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    state.poke();
    json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

fn log_path(state: &State, ns: &str, pod: &str) -> std::path::PathBuf {
    state.cfg.work_dir.join("pods").join(format!("{ns}_{pod}")).join("container.log")
}

async fn pod_log(state: &Arc<State>, ns: &str, name: &str, q: &HashMap<String, String>) -> Response {
    let Some(pod) = state.store.lock().get(Kind::Pod, ns, name).cloned() else { return not_found(Kind::Pod, name) };
    let container = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("").to_string();
    if let Some(c) = q.get("container") {
        if *c != container {
            return bad_request(&format!("container {c} is not valid for pod {name}"));
        }
    }
    let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
    if pod["status"]["phase"] == "Pending" {
        let why = if waiting["reason"].as_str().is_some_and(|r| r.contains("Image")) {
            "trying and failing to pull image".to_string()
        } else {
            waiting["reason"].as_str().unwrap_or("ContainerCreating").to_string()
        };
        return bad_request(&format!("container \"{container}\" in pod \"{name}\" is waiting to start: {why}"));
    }
    let path = log_path(state, ns, name);
    let follow = q.get("follow").is_some_and(|f| f == "true");
    let limit = q.get("limitBytes").and_then(|l| l.parse::<usize>().ok());
    let tail = q.get("tailLines").and_then(|l| l.parse::<usize>().ok());
    if !follow {
        let mut data = std::fs::read(&path).unwrap_or_default();
        if let Some(n) = tail {
            let text = String::from_utf8_lossy(&data).into_owned();
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            data = lines[lines.len().saturating_sub(n)..].concat().into_bytes();
        }
        if let Some(l) = limit {
            data.truncate(l);
        }
        return (StatusCode::OK, [("content-type", "text/plain")], data).into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let state = state.clone();
    let (ns, name, uid) = (ns.to_string(), name.to_string(), meta_str(&pod, "uid").to_string());
    // Fault injection (a test writes the file): every follow stream ends
    // after this many milliseconds, whether the container runs or not, as
    // when an API server restarts or a kubelet drops an idle stream.
    let cut_after = std::fs::read_to_string(state.cfg.work_dir.join("faults/log-streams-end-after-ms"))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    let opened = std::time::Instant::now();
    tokio::spawn(async move {
        let mut off = 0u64;
        loop {
            if cut_after.is_some_and(|c| opened.elapsed() >= c) {
                return;
            }
            // Whether the container has ended, read before the file so that
            // its last bytes are read after it ended.
            let ended = {
                let st = state.store.lock();
                st.get(Kind::Pod, &ns, &name).is_none_or(|p| {
                    meta_str(p, "uid") != uid || matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
                })
            };
            let ended = ended && !state.procs.lock().contains_key(&uid);
            if let Ok(data) = read_from(&path, off) {
                if !data.is_empty() {
                    off += data.len() as u64;
                    if tx.send(Bytes::from(data)).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
            if ended || tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let stream =
        futures_util::stream::unfold(
            rx,
            |mut rx| async move { rx.recv().await.map(|b| (Ok::<Bytes, Infallible>(b), rx)) },
        );
    (StatusCode::OK, [("content-type", "text/plain")], Body::from_stream(stream)).into_response()
}

fn read_from(path: &std::path::Path, off: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(off))?;
    let mut buf = Vec::new();
    f.take(1 << 20).read_to_end(&mut buf)?;
    Ok(buf)
}

/// kubectl's short durations (`45s`, `3m12s`, `5h`, `2d`).
pub fn human(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => {
            if s % 60 == 0 {
                format!("{}m", s / 60)
            } else {
                format!("{}m{}s", s / 60, s % 60)
            }
        }
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn age(obj: &Value, now: i64) -> String {
    obj["metadata"]["creationTimestamp"].as_str().and_then(parse_rfc3339).map_or("<unknown>".into(), |t| human(now - t))
}

/// What `kubectl get pods` shows as STATUS.
pub fn pod_status(p: &Value) -> String {
    if p["metadata"]["deletionTimestamp"].is_string()
        && !matches!(p["status"]["phase"].as_str(), Some("Failed" | "Succeeded"))
    {
        return "Terminating".into();
    }
    let mut reason = p["status"]["phase"].as_str().unwrap_or("Unknown").to_string();
    if let Some(r) = p["status"]["reason"].as_str() {
        reason = r.to_string();
    }
    for c in p["status"]["containerStatuses"].as_array().into_iter().flatten() {
        let s = &c["state"];
        if let Some(r) = s["waiting"]["reason"].as_str() {
            reason = r.to_string();
        } else if let Some(r) = s["terminated"]["reason"].as_str() {
            reason = r.to_string();
        } else if s["terminated"].is_object() {
            reason = format!("ExitCode:{}", s["terminated"]["exitCode"]);
        }
    }
    reason
}

/// What `kubectl get jobs` shows as STATUS.
pub fn job_status(j: &Value) -> String {
    let conds = j["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let is = |t: &str| conds.iter().any(|c| c["type"] == t && c["status"] == "True");
    if is("Complete") {
        "Complete".into()
    } else if is("Failed") {
        "Failed".into()
    } else if is("FailureTarget") {
        "FailureTarget".into()
    } else if j["spec"]["suspend"] == json!(true) {
        "Suspended".into()
    } else {
        "Running".into()
    }
}

fn col(name: &str, typ: &str, priority: u32) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": typ, "format": format, "description": "", "priority": priority})
}

/// A `meta.k8s.io/v1` Table, as `kubectl get` asks for.
pub fn table(kind: Kind, items: &[Value], rv: u64) -> Value {
    let now = now_s();
    let (cols, rows): (Vec<Value>, Vec<Vec<Value>>) = match kind {
        Kind::Pod => (
            vec![
                col("Name", "string", 0),
                col("Ready", "string", 0),
                col("Status", "string", 0),
                col("Restarts", "string", 0),
                col("Age", "string", 0),
                col("IP", "string", 1),
                col("Node", "string", 1),
            ],
            items
                .iter()
                .map(|p| {
                    let cs = p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
                    let total = p["spec"]["containers"].as_array().map_or(0, Vec::len);
                    let ready = cs.iter().filter(|c| c["ready"] == json!(true)).count();
                    vec![
                        json!(meta_str(p, "name")),
                        json!(format!("{ready}/{total}")),
                        json!(pod_status(p)),
                        json!("0"),
                        json!(age(p, now)),
                        json!(p["status"]["podIP"].as_str().unwrap_or("<none>")),
                        json!(p["spec"]["nodeName"].as_str().unwrap_or("<none>")),
                    ]
                })
                .collect(),
        ),
        Kind::Job => (
            vec![
                col("Name", "string", 0),
                col("Status", "string", 0),
                col("Completions", "string", 0),
                col("Duration", "string", 0),
                col("Age", "string", 0),
                col("Containers", "string", 1),
                col("Images", "string", 1),
                col("Selector", "string", 1),
            ],
            items
                .iter()
                .map(|j| {
                    let start = j["status"]["startTime"].as_str().and_then(parse_rfc3339);
                    let end = j["status"]["completionTime"].as_str().and_then(parse_rfc3339).unwrap_or(now);
                    let c = &j["spec"]["template"]["spec"]["containers"][0];
                    vec![
                        json!(meta_str(j, "name")),
                        json!(job_status(j)),
                        json!(format!(
                            "{}/{}",
                            j["status"]["succeeded"].as_u64().unwrap_or(0),
                            j["spec"]["completions"].as_u64().unwrap_or(1)
                        )),
                        json!(start.map_or(String::new(), |s| human(end - s))),
                        json!(age(j, now)),
                        json!(c["name"].as_str().unwrap_or("")),
                        json!(c["image"].as_str().unwrap_or("")),
                        json!(format!("batch.kubernetes.io/controller-uid={}", meta_str(j, "uid"))),
                    ]
                })
                .collect(),
        ),
        Kind::Node => (
            vec![
                col("Name", "string", 0),
                col("Status", "string", 0),
                col("Roles", "string", 0),
                col("Age", "string", 0),
                col("Version", "string", 0),
            ],
            items
                .iter()
                .map(|n| {
                    vec![
                        json!(meta_str(n, "name")),
                        json!("Ready"),
                        json!("<none>"),
                        json!(age(n, now)),
                        json!(n["status"]["nodeInfo"]["kubeletVersion"].as_str().unwrap_or("")),
                    ]
                })
                .collect(),
        ),
        _ => (
            vec![col("Name", "string", 0), col("Age", "string", 0)],
            items.iter().map(|o| vec![json!(meta_str(o, "name")), json!(age(o, now))]).collect(),
        ),
    };
    let rows: Vec<Value> = rows
        .into_iter()
        .zip(items)
        .map(|(cells, o)| {
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": cols, "rows": rows})
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_durations() {
        for (s, want) in
            [(5, "5s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (4 * 3600 + 120, "4h2m"), (72 * 3600, "3d")]
        {
            assert_eq!(super::human(s), want);
        }
    }
}
