//! Reading what Slurm's own commands print as JSON (`squeue --json`,
//! `sacct --json`), which the agent and `fleet-proxy` both read.

/// A number in any of Slurm's JSON dialects: a plain number (22.05's
/// v0.0.38) or `{"set": true, "infinite": false, "number": n}` (23.02+);
/// `None` for an unset or infinite one, or no number.
pub fn number(v: &serde_json::Value) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    if let Some(n) = v.as_u64() {
        return i64::try_from(n).ok();
    }
    let o = v.as_object()?;
    if o.get("set").and_then(|s| s.as_bool()) == Some(false)
        || o.get("infinite").and_then(|s| s.as_bool()) == Some(true)
    {
        return None;
    }
    number(o.get("number")?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_read_as_each_slurm_writes_them() {
        assert_eq!(number(&json!(90)), Some(90));
        assert_eq!(number(&json!(-1)), Some(-1));
        assert_eq!(number(&json!({"set": true, "infinite": false, "number": 90})), Some(90));
        assert_eq!(number(&json!({"set": true, "infinite": true, "number": 0})), None);
        assert_eq!(number(&json!({"set": false, "infinite": false, "number": 0})), None);
        assert_eq!(number(&json!("90")), None);
        assert_eq!(number(&serde_json::Value::Null), None);
    }
}
