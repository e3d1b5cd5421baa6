//! Slurm hostlist expressions: `gpu[01-16,20]`, `a[1-2]b[3-4]`
//! (cartesian, first bracket outermost), `node1,node[3-5]`.
//!
//! * Zero padding follows each range's lower bound: `[08-10]` gives
//!   `08 09 10`, `[8-10]` gives `8 9 10`.
//! * Items are separated by `,` or blanks outside brackets; empty items
//!   are ignored.
//! * Errors: a reversed range (`x[5-1]`), an unclosed or stray bracket,
//!   a non-numeric range, nested brackets, and more than the cap of names
//!   ([`MAX_NAMES`] by default) — counted before anything is allocated,
//!   so a hostile `x[0-999999999999]` costs nothing.
//!
//! [`compress`] is the inverse: `expand(&compress(names))` gives the
//! same names (grouped by prefix, numbers ascending, duplicates dropped).

use std::fmt::Write as _;

/// Default cap on the number of names one expression may expand to.
pub const MAX_NAMES: usize = 1_000_000;

/// Cap on the bytes of names one expression may expand to.
pub const MAX_BYTES: usize = 64 << 20;

/// Why an expression could not be expanded. Display gives the whole
/// message, naming the expression.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad hostlist \"{expr}\": {problem}")]
pub struct HostlistError {
    pub expr: String,
    pub problem: String,
}

/// A cap on the names expanded over a whole file (many lines), so that
/// many `x[1-1000000]` lines cannot add up to gigabytes.
#[derive(Clone, Debug)]
pub struct Budget {
    left: usize,
}

impl Budget {
    pub fn new(names: usize) -> Self {
        Budget { left: names }
    }

    /// Expands `expr` within what is left of the budget; Err is the
    /// problem (without the expression).
    pub fn expand(&mut self, expr: &str) -> Result<Vec<String>, String> {
        let names = expand_capped(expr, self.left).map_err(|e| {
            if e.problem.starts_with("expands to more than") && self.left < MAX_NAMES {
                format!("{} (the file's total is capped at {MAX_NAMES} names)", e.problem)
            } else {
                e.problem
            }
        })?;
        self.left -= names.len();
        Ok(names)
    }

    /// Takes `units` more from the budget (copies made per name).
    pub fn charge(&mut self, units: usize) -> Result<(), String> {
        match self.left.checked_sub(units) {
            Some(l) => {
                self.left = l;
                Ok(())
            }
            None => Err(format!("too large: the file's total is capped at {MAX_NAMES} names × fields")),
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(MAX_NAMES)
    }
}

/// Expands `expr` with the default cap.
pub fn expand(expr: &str) -> Result<Vec<String>, HostlistError> {
    expand_capped(expr, MAX_NAMES)
}

/// Expands `expr`, failing if it would give more than `cap` names.
pub fn expand_capped(expr: &str, cap: usize) -> Result<Vec<String>, HostlistError> {
    let err = |problem: String| HostlistError { expr: shorten(expr), problem };
    let items = split_top(expr).map_err(err)?;
    // Parse everything and count first; allocate after.
    let mut parsed = Vec::with_capacity(items.len());
    let mut total: usize = 0;
    let mut bytes: usize = 0;
    for item in items {
        let parts = parse_item(item).map_err(err)?;
        let n = parts.iter().try_fold(1usize, |acc, p| match p {
            Part::Lit(_) => Some(acc),
            Part::Ranges(r) => acc.checked_mul(range_count(r)?),
        });
        total = n
            .and_then(|n| total.checked_add(n))
            .filter(|&t| t <= cap)
            .ok_or_else(|| err(format!("expands to more than {cap} names")))?;
        bytes = n
            .and_then(|n| n.checked_mul(max_name_len(&parts)))
            .and_then(|b| bytes.checked_add(b))
            .filter(|&b| b <= MAX_BYTES)
            .ok_or_else(|| err(format!("expands to more than {MAX_BYTES} bytes")))?;
        parsed.push(parts);
    }
    let mut out = Vec::with_capacity(total);
    for parts in &parsed {
        emit(parts, &mut out);
    }
    Ok(out)
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 80 {
        let mut t: String = s.chars().take(80).collect();
        t.push('…');
        t
    } else {
        s.to_string()
    }
}

#[derive(Debug)]
enum Part<'a> {
    Lit(&'a str),
    /// `(lo, hi, width)`
    Ranges(Vec<(u64, u64, usize)>),
}

fn range_count(r: &[(u64, u64, usize)]) -> Option<usize> {
    r.iter().try_fold(0usize, |acc, &(lo, hi, _)| {
        let n = usize::try_from(hi - lo).ok()?.checked_add(1)?;
        acc.checked_add(n)
    })
}

/// Splits at `,` and blanks outside brackets.
fn split_top(expr: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in expr.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err("nested '['".into());
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err("']' without '['".into());
                }
                depth -= 1;
            }
            ',' | ' ' | '\t' | '\n' | '\r' if depth == 0 => {
                if i > start {
                    out.push(&expr[start..i]);
                }
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("unclosed '['".into());
    }
    if expr.len() > start {
        out.push(&expr[start..]);
    }
    Ok(out)
}

fn parse_item(item: &str) -> Result<Vec<Part<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = item;
    while !rest.is_empty() {
        match rest.find('[') {
            None => {
                parts.push(Part::Lit(rest));
                break;
            }
            Some(open) => {
                if open > 0 {
                    parts.push(Part::Lit(&rest[..open]));
                }
                // split_top guarantees a matching ']'.
                let close = rest[open..].find(']').map(|c| open + c).ok_or("unclosed '['")?;
                parts.push(Part::Ranges(parse_ranges(&rest[open + 1..close])?));
                rest = &rest[close + 1..];
            }
        }
    }
    Ok(parts)
}

fn parse_ranges(body: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    if body.trim().is_empty() {
        return Err("empty '[]'".into());
    }
    body.split(',')
        .map(|r| {
            let r = r.trim();
            let (lo_s, hi_s) = match r.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (r, r),
            };
            let lo = number(lo_s)?;
            let hi = number(hi_s)?;
            if hi < lo {
                return Err(format!("range \"{r}\" goes down ({lo} > {hi})"));
            }
            Ok((lo, hi, lo_s.len()))
        })
        .collect()
}

fn number(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("\"{}\" is not a number", shorten(s)));
    }
    if s.len() > 18 {
        return Err(format!("\"{}\" has too many digits", shorten(s)));
    }
    s.parse().map_err(|_| format!("\"{s}\" is not a number"))
}

/// Longest name `parts` can produce (bytes).
fn max_name_len(parts: &[Part<'_>]) -> usize {
    parts
        .iter()
        .map(|p| match p {
            Part::Lit(s) => s.len(),
            Part::Ranges(r) => r.iter().map(|&(_, hi, w)| w.max(digits(hi))).max().unwrap_or(0),
        })
        .fold(0usize, usize::saturating_add)
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Appends every name of one item, odometer style (no recursion, so a
/// long chain of brackets cannot exhaust the stack).
fn emit(parts: &[Part<'_>], out: &mut Vec<String>) {
    // Per Ranges part: (range index, current number).
    let mut pos: Vec<(usize, u64)> = parts
        .iter()
        .map(|p| match p {
            Part::Ranges(r) => (0, r.first().map_or(0, |x| x.0)),
            Part::Lit(_) => (0, 0),
        })
        .collect();
    loop {
        let mut name = String::new();
        for (p, &(ri, n)) in parts.iter().zip(&pos) {
            match p {
                Part::Lit(s) => name.push_str(s),
                Part::Ranges(r) => {
                    let width = r.get(ri).map_or(0, |x| x.2);
                    let _ = write!(name, "{n:0width$}");
                }
            }
        }
        out.push(name);
        // Advance the last Ranges part; carry leftwards.
        let mut k = parts.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            let Part::Ranges(r) = &parts[k] else { continue };
            let (ri, n) = pos[k];
            let Some(&(_, hi, _)) = r.get(ri) else { continue };
            if n < hi {
                pos[k].1 = n + 1;
                break;
            }
            if let Some(&(lo, _, _)) = r.get(ri + 1) {
                pos[k] = (ri + 1, lo);
                break;
            }
            pos[k] = (0, r.first().map_or(0, |x| x.0));
        }
    }
}

/// The shortest-ish hostlist expression for `names` (see module doc).
pub fn compress<S: AsRef<str>>(names: &[S]) -> String {
    // Group by prefix (in order of first appearance); names without a
    // numeric suffix (or whose digits would overflow) stand alone.
    let mut groups: Vec<(String, Vec<(u64, String)>)> = Vec::new();
    let mut plain: Vec<(usize, String)> = Vec::new();
    let mut order: Vec<Grp> = Vec::new();
    enum Grp {
        Plain(usize),
        Num(usize),
    }
    for name in names {
        let name = name.as_ref();
        if name.is_empty() {
            continue;
        }
        let digits_at = name.len() - name.bytes().rev().take_while(|b| b.is_ascii_digit()).count();
        let digits = &name[digits_at..];
        match (digits.len(), digits.parse::<u64>()) {
            (1..=18, Ok(n)) => {
                let prefix = &name[..digits_at];
                let gi = match groups.iter().position(|(p, _)| p == prefix) {
                    Some(gi) => gi,
                    None => {
                        groups.push((prefix.to_string(), Vec::new()));
                        order.push(Grp::Num(groups.len() - 1));
                        groups.len() - 1
                    }
                };
                groups[gi].1.push((n, digits.to_string()));
            }
            _ => {
                if !plain.iter().any(|(_, p)| p == name) {
                    plain.push((plain.len(), name.to_string()));
                    order.push(Grp::Plain(plain.len() - 1));
                }
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for g in order {
        match g {
            Grp::Plain(i) => out.push(plain[i].1.clone()),
            Grp::Num(i) => {
                let (prefix, nums) = &mut groups[i];
                nums.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.len().cmp(&b.1.len())));
                nums.dedup();
                out.push(compress_group(prefix, nums));
            }
        }
    }
    out.join(",")
}

fn compress_group(prefix: &str, nums: &[(u64, String)]) -> String {
    if let [(_, only)] = nums {
        return format!("{prefix}{only}");
    }
    let mut items: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nums.len() {
        let (lo, lo_s) = &nums[i];
        let width = lo_s.len();
        let mut j = i;
        while j + 1 < nums.len() {
            let (n, s) = &nums[j + 1];
            if *n == nums[j].0 + 1 && *s == format!("{n:0width$}") {
                j += 1;
            } else {
                break;
            }
        }
        if j == i {
            items.push(lo_s.clone());
        } else {
            items.push(format!("{}-{}", lo_s, nums[j].1));
        }
        let _ = lo;
        i = j + 1;
    }
    format!("{prefix}[{}]", items.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(input: &str, expected: Result<&[&str], &str>) {
        let got = expand(input);
        match expected {
            Ok(names) => assert_eq!(got, Ok(names.iter().map(|s| s.to_string()).collect()), "input {input:?}"),
            Err(msg) => assert_eq!(got.map_err(|e| e.to_string()), Err(msg.to_string()), "input {input:?}"),
        }
    }

    #[test]
    fn expand_table() {
        check("", Ok(&[]));
        check("node1", Ok(&["node1"]));
        check("gpu[01-03,20]", Ok(&["gpu01", "gpu02", "gpu03", "gpu20"]));
        check("gpu[08-10]", Ok(&["gpu08", "gpu09", "gpu10"]));
        check("gpu[8-10]", Ok(&["gpu8", "gpu9", "gpu10"]));
        check("a[1-2]b[3-4]", Ok(&["a1b3", "a1b4", "a2b3", "a2b4"]));
        check("node1,node[3-5]", Ok(&["node1", "node3", "node4", "node5"]));
        check("a, b  c,,", Ok(&["a", "b", "c"]));
        check("[1-2]", Ok(&["1", "2"]));
        check("x[1]y", Ok(&["x1y"]));
        check("/dev/nvidia[0-1]", Ok(&["/dev/nvidia0", "/dev/nvidia1"]));
        check("10.0.0.[1-2]", Ok(&["10.0.0.1", "10.0.0.2"]));
        check("x[5-1]", Err("bad hostlist \"x[5-1]\": range \"5-1\" goes down (5 > 1)"));
        check("x[1-", Err("bad hostlist \"x[1-\": unclosed '['"));
        check("x]", Err("bad hostlist \"x]\": ']' without '['"));
        check("x[[1]]", Err("bad hostlist \"x[[1]]\": nested '['"));
        check("x[]", Err("bad hostlist \"x[]\": empty '[]'"));
        check("x[a-b]", Err("bad hostlist \"x[a-b]\": \"a\" is not a number"));
        check("x[1-]", Err("bad hostlist \"x[1-]\": \"\" is not a number"));
        check(
            "x[1234567890123456789]",
            Err("bad hostlist \"x[1234567890123456789]\": \"1234567890123456789\" has too many digits"),
        );
        check(
            "x[0-999999999999999999]",
            Err("bad hostlist \"x[0-999999999999999999]\": expands to more than 1000000 names"),
        );
        check(
            "x[0-999]y[0-999]z[0-999]",
            Err("bad hostlist \"x[0-999]y[0-999]z[0-999]\": expands to more than 1000000 names"),
        );
    }

    #[test]
    fn byte_cap_holds_for_long_names() {
        let long = format!("{}[0-99999]", "x".repeat(1000));
        assert_eq!(expand(&long).unwrap_err().problem, format!("expands to more than {MAX_BYTES} bytes"));
        let deep = "[1]".repeat(100_000);
        assert_eq!(expand(&deep).unwrap(), vec!["1".repeat(100_000)]);
    }

    #[test]
    fn cap_counts_across_items() {
        assert!(expand_capped("a[1-3],b[1-3]", 6).is_ok());
        assert_eq!(expand_capped("a[1-3],b[1-3]", 5).unwrap_err().problem, "expands to more than 5 names");
    }

    fn check_compress(names: &[&str], expected: &str) {
        assert_eq!(compress(names), expected, "names {names:?}");
    }

    #[test]
    fn compress_table() {
        check_compress(&[], "");
        check_compress(&["node1"], "node1");
        check_compress(&["gpu01", "gpu02", "gpu03", "gpu20"], "gpu[01-03,20]");
        check_compress(&["gpu09", "gpu10", "gpu11"], "gpu[09-11]");
        check_compress(&["n9", "n10", "n11"], "n[9-11]");
        check_compress(&["n3", "n1", "n2", "n2"], "n[1-3]");
        check_compress(&["a1", "b1", "a2", "login"], "a[1-2],b1,login");
        check_compress(&["n1", "n01"], "n[1,01]");
        check_compress(&["n1", "n02"], "n[1,02]");
    }

    proptest! {
        #[test]
        fn compress_then_expand_round_trips(names in proptest::collection::vec("[a-c]{0,2}[0-9]{0,3}", 0..40)) {
            let expr = compress(&names);
            let back = expand(&expr).unwrap();
            let mut want: Vec<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
            want.sort();
            want.dedup();
            let mut got = back.clone();
            got.sort();
            prop_assert_eq!(&got, &want, "expr {}", expr);
            // No duplicates come out of compress.
            let mut dedup = back.clone();
            dedup.sort();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), back.len());
        }

        #[test]
        fn expand_never_panics(s in "[a-z0-9\\[\\],\\- ]{0,30}") {
            let _ = expand_capped(&s, 10_000);
        }
    }
}
