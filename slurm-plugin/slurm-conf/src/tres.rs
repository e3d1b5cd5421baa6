//! TRES strings from `job_desc_msg_t.tres_per_{job,node,task,socket}`
//! into [`GpuRequest`]s.
//!
//! What real Slurm puts there (checked against SchedMD/slurm):
//! * `--gres=gpu:h100:8` → `tres_per_node`; sbatch prepends the TRES type
//!   to every comma-separated item (`gres_prepend_tres_type`): Slurm
//!   21.08–22.05 write `gres:gpu:h100:8`, 23.02 and later `gres/gpu:h100:8`.
//!   `--gres=gpu:2,shard:1` → `gres:gpu:2,gres:shard:1`.
//! * `--gpus=`/`-G` → `tres_per_job`, `--gpus-per-node=` → `tres_per_node`,
//!   `--gpus-per-task=` → `tres_per_task`, `--gpus-per-socket=` →
//!   `tres_per_socket`, each as `gres:gpu:[type:]N` (`gres/` later).
//! * The TRES form `gres/gpu=8`, `gres/gpu:h100=8` is accepted too.
//!
//! Rules here: items are separated by `,` or `;`; the `gres:`/`gres/`
//! prefix may be absent; items whose name is not `gpu` (`gres:shard:2`,
//! `gres/mps:100`, `license/x=1`, `cpu=4`) are skipped; `gpu` alone means
//! one GPU and `gpu:h100` one H100; a field that starts with a digit is a
//! count, otherwise a type (as Slurm decides); counts may carry a
//! `k/m/g/t/p` suffix (powers of 1024, Slurm's `suffix_mult`) and must fit
//! in u32; a count of 0 asks for nothing and yields no request.

use fleet_api::{GpuRequest, GpuScope};

use crate::value::parse_count;

/// A malformed GPU item. Display: `bad GPU request "<item>": <problem>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad GPU request \"{item}\": {problem}")]
pub struct TresError {
    pub item: String,
    pub problem: String,
}

/// Longest item text kept in an error.
const MAX_SHOWN: usize = 100;

/// Every GPU request in one TRES string, with the given scope.
pub fn parse_tres(s: &str, scope: GpuScope) -> Result<Vec<GpuRequest>, TresError> {
    let mut out = Vec::new();
    for item in s.split([',', ';']) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        if let Some(req) = parse_item(item, scope)? {
            out.push(req);
        }
    }
    Ok(out)
}

/// All four `tres_per_*` fields of a job at once (in the order job,
/// node, task, socket); `None` fields are skipped.
pub fn parse_job_tres(
    per_job: Option<&str>,
    per_node: Option<&str>,
    per_task: Option<&str>,
    per_socket: Option<&str>,
) -> Result<Vec<GpuRequest>, TresError> {
    let mut out = Vec::new();
    for (s, scope) in [
        (per_job, GpuScope::Job),
        (per_node, GpuScope::Node),
        (per_task, GpuScope::Task),
        (per_socket, GpuScope::Socket),
    ] {
        if let Some(s) = s {
            out.extend(parse_tres(s, scope)?);
        }
    }
    Ok(out)
}

fn parse_item(item: &str, scope: GpuScope) -> Result<Option<GpuRequest>, TresError> {
    let err = |problem: String| TresError {
        item: if item.chars().count() > MAX_SHOWN {
            item.chars().take(MAX_SHOWN).chain(std::iter::once('…')).collect()
        } else {
            item.to_string()
        },
        problem,
    };
    let body = strip_prefix_ci(item, "gres:").or_else(|| strip_prefix_ci(item, "gres/")).unwrap_or(item);
    let name_end = body.find([':', '=']).unwrap_or(body.len());
    let (name, rest) = body.split_at(name_end);
    if !name.eq_ignore_ascii_case("gpu") {
        return Ok(None);
    }
    let (gpu_type, count_s): (Option<&str>, Option<&str>) = if let Some(c) = rest.strip_prefix('=') {
        (None, Some(c))
    } else if let Some(fields) = rest.strip_prefix(':') {
        if let Some((t, c)) = fields.split_once('=') {
            (Some(t), Some(c))
        } else {
            match fields.split(':').collect::<Vec<_>>().as_slice() {
                [one] if one.starts_with(|c: char| c.is_ascii_digit()) => (None, Some(*one)),
                [one] => (Some(*one), None),
                [t, c] => (Some(*t), Some(*c)),
                _ => return Err(err("expected gpu[:type][:count]".into())),
            }
        }
    } else {
        (None, None)
    };
    if let Some(t) = gpu_type {
        if t.is_empty() {
            return Err(err("empty GPU type".into()));
        }
        if !t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return Err(err(format!("type \"{t}\" has characters other than letters, digits, '_', '-', '.'")));
        }
    }
    let count = match count_s {
        None => 1,
        Some(c) => {
            let n = parse_count(c).map_err(|why| err(format!("count \"{c}\" {why}")))?;
            u32::try_from(n).map_err(|_| err(format!("count \"{c}\" is too large")))?
        }
    };
    if count == 0 {
        return Ok(None);
    }
    Ok(Some(GpuRequest { gpu_type: gpu_type.map(str::to_string), count, scope }))
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(t: Option<&str>, count: u32) -> GpuRequest {
        GpuRequest { gpu_type: t.map(str::to_string), count, scope: GpuScope::Node }
    }

    fn check(input: &str, expected: Result<Vec<GpuRequest>, &str>) {
        let got = parse_tres(input, GpuScope::Node).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_string), "input {input:?}");
    }

    #[test]
    fn tres_table() {
        // Slurm 22.05 (gres:) forms.
        check("gres:gpu:h100:8", Ok(vec![g(Some("h100"), 8)]));
        check("gres:gpu:8", Ok(vec![g(None, 8)]));
        check("gres:gpu", Ok(vec![g(None, 1)]));
        check("gres:gpu:h100", Ok(vec![g(Some("h100"), 1)]));
        check("gres:gpu:2,gres:shard:1", Ok(vec![g(None, 2)]));
        // 23.02+ (gres/) and TRES (=) forms.
        check("gres/gpu:h100:8", Ok(vec![g(Some("h100"), 8)]));
        check("gres/gpu=8", Ok(vec![g(None, 8)]));
        check("gres/gpu:h100=8", Ok(vec![g(Some("h100"), 8)]));
        check("GRES/GPU:A100:4", Ok(vec![g(Some("A100"), 4)]));
        // Separators, skipping, several GPU items.
        check("cpu=4;gres/gpu:a100:2;license/matlab=1", Ok(vec![g(Some("a100"), 2)]));
        check("gres:gpu:h100:4,gres:gpu:a100:2", Ok(vec![g(Some("h100"), 4), g(Some("a100"), 2)]));
        check("gres/mps:100,gres:shard:2", Ok(vec![]));
        check("gpu:3", Ok(vec![g(None, 3)]));
        check("", Ok(vec![]));
        check(" , ;", Ok(vec![]));
        check("gres:gpu:0", Ok(vec![]));
        check("gres:gpus:4", Ok(vec![]));
        check("gres:gpu:1k", Ok(vec![g(None, 1024)]));
        check("gres:gpu:1g.5gb:2", Ok(vec![g(Some("1g.5gb"), 2)]));
        // Errors.
        check("gres:gpu:h100:x", Err("bad GPU request \"gres:gpu:h100:x\": count \"x\" is not a number"));
        check("gres:gpu:h100:", Err("bad GPU request \"gres:gpu:h100:\": count \"\" is not a number"));
        check("gres/gpu=", Err("bad GPU request \"gres/gpu=\": count \"\" is not a number"));
        check("gres:gpu:8x", Err("bad GPU request \"gres:gpu:8x\": count \"8x\" is not a number"));
        check("gres:gpu::8", Err("bad GPU request \"gres:gpu::8\": empty GPU type"));
        check("gres:gpu:a:b:c", Err("bad GPU request \"gres:gpu:a:b:c\": expected gpu[:type][:count]"));
        check("gres:gpu:h100:-1", Err("bad GPU request \"gres:gpu:h100:-1\": count \"-1\" is not a number"));
        check(
            "gres:gpu:h100:4294967296",
            Err("bad GPU request \"gres:gpu:h100:4294967296\": count \"4294967296\" is too large"),
        );
        check("gres:gpu:h 1:2", Err("bad GPU request \"gres:gpu:h 1:2\": type \"h 1\" has characters other than letters, digits, '_', '-', '.'"));
        check("gres:gpu:h100:99999999999999999999999", Err("bad GPU request \"gres:gpu:h100:99999999999999999999999\": count \"99999999999999999999999\" is too large"));
    }

    #[test]
    fn job_tres_scopes() {
        let got = parse_job_tres(Some("gres:gpu:h100:2"), None, Some("gres/gpu:1"), Some("gres:gpu=3")).unwrap();
        assert_eq!(
            got,
            vec![
                GpuRequest { gpu_type: Some("h100".into()), count: 2, scope: GpuScope::Job },
                GpuRequest { gpu_type: None, count: 1, scope: GpuScope::Task },
                GpuRequest { gpu_type: None, count: 3, scope: GpuScope::Socket },
            ]
        );
        assert!(parse_job_tres(None, Some("gres:gpu:x:y"), None, None).is_err());
    }

    #[test]
    fn long_items_are_shortened_in_errors() {
        let item = format!("gres:gpu:{}:x", "a".repeat(500));
        let e = parse_tres(&item, GpuScope::Node).unwrap_err();
        assert_eq!(e.item.chars().count(), MAX_SHOWN + 1);
    }
}
