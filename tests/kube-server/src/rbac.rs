//! Who a request is and what it may do, as the API server decides.
//!
//! **Authentication.** A bearer token is either one of the server's
//! configured tokens (`[[token]]`, the bootstrap credentials: the lab's
//! admin) or a ServiceAccount's: the token of a Secret of type
//! `kubernetes.io/service-account-token` annotated
//! `kubernetes.io/service-account.name`, which the token controller fills
//! when the Secret is created (here: at admission, [`fill_token`]). Such a
//! token is user `system:serviceaccount:<ns>:<name>` in groups
//! `system:serviceaccounts`, `system:serviceaccounts:<ns>` and
//! `system:authenticated`, valid while its ServiceAccount and Secret exist.
//!
//! **Authorization.** A configured token is allowed by its table (its
//! namespaces, `*` for everything, Nodes readable or not). A ServiceAccount
//! by RBAC (`rbac.authorization.k8s.io/v1`): the rules of the ClusterRoles
//! its ClusterRoleBindings name hold everywhere, those of the Roles and
//! ClusterRoles its RoleBindings name hold in the binding's namespace; a
//! rule allows a request when its `verbs`, `apiGroups`, `resources`
//! (`pods/log` for a subresource, `*` for all) and `resourceNames` (empty:
//! all) all match. Nothing else is allowed (no default roles beyond
//! discovery and SelfSubjectAccessReview, which every authenticated user
//! has).

use base64::Engine as _;
use serde_json::{json, Value};

use crate::store::{meta_str, Kind, Store, RBAC_GROUP};
use crate::{State, TokenConf};

/// The type of a Secret holding a ServiceAccount's token.
pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
/// The annotation naming the token's ServiceAccount.
pub const SA_NAME: &str = "kubernetes.io/service-account.name";

/// An authenticated caller.
#[derive(Clone, Debug)]
pub struct Subject {
    pub user: String,
    pub groups: Vec<String>,
    /// A configured token: authorized by its table, not RBAC.
    pub table: Option<TokenConf>,
}

/// What a request asks for.
#[derive(Debug)]
pub struct Attrs<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// `pods`, or `pods/log` for a subresource.
    pub resource: &'a str,
    pub ns: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// The caller of a request bearing `token`, if it is one.
pub fn authenticate(state: &State, token: &str) -> Option<Subject> {
    if token.is_empty() {
        return None;
    }
    if let Some(t) = state.cfg.tokens.iter().find(|c| c.token == token) {
        return Some(Subject {
            user: t.user.clone(),
            groups: vec!["system:authenticated".into()],
            table: Some(t.clone()),
        });
    }
    let st = state.store.lock();
    let b64 = base64::engine::general_purpose::STANDARD;
    for s in st.list(Kind::Secret, None) {
        if s["type"] != SA_TOKEN_TYPE {
            continue;
        }
        let stored = s["data"]["token"].as_str().and_then(|t| b64.decode(t).ok()).unwrap_or_default();
        // Compared whole; tokens are random, so a match is the one Secret.
        if stored.is_empty() || stored != token.as_bytes() {
            continue;
        }
        let ns = meta_str(s, "namespace");
        let sa = s["metadata"]["annotations"][SA_NAME].as_str().unwrap_or("");
        st.get(Kind::ServiceAccount, ns, sa)?;
        return Some(Subject {
            user: format!("system:serviceaccount:{ns}:{sa}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            table: None,
        });
    }
    None
}

/// The token controller: a new Secret of type service-account-token for
/// an existing ServiceAccount gets a fresh random token (whatever the
/// creator put there) and its namespace.
pub fn fill_token(st: &Store, obj: &mut Value) -> Result<(), String> {
    if obj["type"] != SA_TOKEN_TYPE {
        return Ok(());
    }
    let ns = meta_str(obj, "namespace").to_string();
    let Some(sa) = obj["metadata"]["annotations"][SA_NAME].as_str().map(str::to_string) else {
        return Err(format!("metadata.annotations[{SA_NAME}]: Required value"));
    };
    if st.get(Kind::ServiceAccount, &ns, &sa).is_none() {
        return Err(format!("serviceaccounts \"{sa}\" not found"));
    }
    let mut raw = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .map_err(|e| format!("minting a token: {e}"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let b64 = base64::engine::general_purpose::STANDARD;
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    obj["data"]["token"] = json!(b64.encode(token));
    obj["data"]["namespace"] = json!(b64.encode(&ns));
    Ok(())
}

/// Does a configured token's table allow it?
fn table_allows(tok: &TokenConf, a: &Attrs) -> bool {
    let all = tok.namespaces.iter().any(|n| n == "*");
    if all {
        return true;
    }
    match (a.group, a.resource) {
        ("", "nodes") => tok.nodes && matches!(a.verb, "get" | "list" | "watch"),
        ("", "namespaces") => a.verb == "get" && a.name.is_some_and(|n| tok.namespaces.iter().any(|t| t == n)),
        _ => a.ns.is_some_and(|n| tok.namespaces.iter().any(|t| t == n)),
    }
}

fn has(list: &Value, want: &str) -> bool {
    list.as_array().into_iter().flatten().any(|v| v == "*" || v == want)
}

/// Does one PolicyRule allow the request?
fn rule_allows(rule: &Value, a: &Attrs) -> bool {
    if !has(&rule["verbs"], a.verb) || !has(&rule["apiGroups"], a.group) {
        return false;
    }
    let res_ok = rule["resources"].as_array().into_iter().flatten().filter_map(Value::as_str).any(|r| {
        r == "*" || r == a.resource || a.resource.split_once('/').is_some_and(|(base, _)| r == format!("{base}/*"))
    });
    if !res_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => a.name.is_some_and(|n| names.iter().any(|x| x == n)),
        _ => true,
    }
}

fn subject_matches(s: &Value, who: &Subject) -> bool {
    match s["kind"].as_str() {
        Some("ServiceAccount") => {
            let (ns, name) = (s["namespace"].as_str().unwrap_or(""), s["name"].as_str().unwrap_or(""));
            who.user == format!("system:serviceaccount:{ns}:{name}")
        }
        Some("User") => s["name"].as_str() == Some(who.user.as_str()),
        Some("Group") => s["name"].as_str().is_some_and(|g| who.groups.iter().any(|x| x == g)),
        _ => false,
    }
}

fn bound(binding: &Value, who: &Subject) -> bool {
    binding["subjects"].as_array().into_iter().flatten().any(|s| subject_matches(s, who))
}

fn role_rules<'a>(st: &'a Store, role_ref: &Value, ns: &str) -> Vec<&'a Value> {
    if role_ref["apiGroup"].as_str().is_some_and(|g| g != RBAC_GROUP) {
        return Vec::new();
    }
    let name = role_ref["name"].as_str().unwrap_or("");
    let role = match role_ref["kind"].as_str() {
        Some("ClusterRole") => st.get(Kind::ClusterRole, "", name),
        Some("Role") => st.get(Kind::Role, ns, name),
        _ => None,
    };
    role.and_then(|r| r["rules"].as_array()).map(|r| r.iter().collect()).unwrap_or_default()
}

/// Does RBAC (or the caller's table) allow the request?
pub fn allows(st: &Store, who: &Subject, a: &Attrs) -> bool {
    if let Some(t) = &who.table {
        return table_allows(t, a);
    }
    for b in st.list(Kind::ClusterRoleBinding, None) {
        if bound(b, who) && role_rules(st, &b["roleRef"], "").into_iter().any(|r| rule_allows(r, a)) {
            return true;
        }
    }
    let Some(ns) = a.ns else { return false };
    st.list(Kind::RoleBinding, Some(ns))
        .into_iter()
        .any(|b| bound(b, who) && role_rules(st, &b["roleRef"], ns).into_iter().any(|r| rule_allows(r, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(verb: &'a str, group: &'a str, resource: &'a str, ns: Option<&'a str>) -> Attrs<'a> {
        Attrs { verb, group, resource, ns, name: None }
    }

    #[test]
    fn roles_bind_by_namespace_and_cluster_roles_everywhere() {
        let mut st = Store::default();
        st.put(
            Kind::ClusterRole,
            json!({"metadata": {"name": "agent"}, "rules": [
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create"]},
                {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]}),
        );
        st.put(
            Kind::ClusterRole,
            json!({"metadata": {"name": "nodes"}, "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}),
        );
        st.put(
            Kind::RoleBinding,
            json!({"metadata": {"name": "b", "namespace": "fleet"}, "subjects": [{"kind": "ServiceAccount", "name": "a", "namespace": "fleet"}],
                   "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "agent"}}),
        );
        st.put(
            Kind::ClusterRoleBinding,
            json!({"metadata": {"name": "n"}, "subjects": [{"kind": "Group", "name": "system:serviceaccounts:fleet"}],
                   "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "nodes"}}),
        );
        let who = Subject {
            user: "system:serviceaccount:fleet:a".into(),
            groups: vec!["system:serviceaccounts:fleet".into()],
            table: None,
        };
        assert!(allows(&st, &who, &attrs("create", "batch", "jobs", Some("fleet"))));
        assert!(allows(&st, &who, &attrs("get", "", "pods/log", Some("fleet"))));
        assert!(allows(&st, &who, &attrs("list", "", "nodes", None)));
        for denied in [
            attrs("create", "batch", "jobs", Some("other")),
            attrs("delete", "batch", "jobs", Some("fleet")),
            attrs("get", "", "jobs", Some("fleet")),
            attrs("get", "", "pods", Some("fleet")),
            attrs("get", "", "secrets", Some("fleet")),
            attrs("delete", "", "nodes", None),
            attrs("list", "batch", "jobs", None),
        ] {
            assert!(!allows(&st, &who, &denied), "{denied:?}");
        }
        let other = Subject { user: "system:serviceaccount:x:a".into(), groups: vec![], table: None };
        assert!(!allows(&st, &other, &attrs("create", "batch", "jobs", Some("fleet"))));
    }
}
