//! Small value parsers shared by the typed configs and `tres`.

/// `yes/no/true/false/1/0/on/off`, any case.
pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" | "on" => Some(true),
        "no" | "false" | "0" | "off" => Some(false),
        _ => None,
    }
}

/// A count as Slurm writes it: decimal digits with an optional `k`, `m`,
/// `g`, `t` or `p` suffix (any case; powers of 1024, as Slurm's
/// `suffix_mult`). Err is a short reason.
pub(crate) fn parse_count(s: &str) -> Result<u64, String> {
    let digits_end = s.bytes().take_while(u8::is_ascii_digit).count();
    let (num, suffix) = s.split_at(digits_end);
    if num.is_empty() {
        return Err("is not a number".into());
    }
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return Err("is not a number".into()),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(|| "is too large".to_string())
}

/// A plain decimal number within `lo..=hi`.
pub(crate) fn parse_in_range(v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number from {lo} to {hi}"));
    }
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from {lo} to {hi}")),
    }
}

/// A Slurm time limit in minutes (`None` = UNLIMITED/INFINITE):
/// `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` (seconds round up).
pub fn parse_time_minutes(v: &str) -> Result<Option<u32>, String> {
    let bad = || format!("\"{v}\" is not a time limit (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED)");
    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let num = |s: &str| -> Result<u64, String> {
        if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u64>().map_err(|_| bad())
    };
    let (days, rest) = match v.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, v),
    };
    let f: Vec<&str> = rest.split(':').collect();
    let (h, m, s) = match (days.is_some(), f.as_slice()) {
        (false, [m]) => (0, num(m)?, 0),
        (false, [m, s]) => (0, num(m)?, num(s)?),
        (false, [h, m, s]) => (num(h)?, num(m)?, num(s)?),
        (true, [h]) => (num(h)?, 0, 0),
        (true, [h, m]) => (num(h)?, num(m)?, 0),
        (true, [h, m, s]) => (num(h)?, num(m)?, num(s)?),
        _ => return Err(bad()),
    };
    let secs = days.unwrap_or(0) * 86_400 + h * 3600 + m * 60 + s;
    let mins = secs.div_ceil(60);
    u32::try_from(mins).map(Some).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: PartialEq + std::fmt::Debug>(got: T, expected: T) {
        assert_eq!(got, expected);
    }

    #[test]
    fn values_table() {
        check(parse_bool("YES"), Some(true));
        check(parse_bool("0"), Some(false));
        check(parse_bool("maybe"), None);
        check(parse_count("8"), Ok(8));
        check(parse_count("2k"), Ok(2048));
        check(parse_count("1M"), Ok(1 << 20));
        check(parse_count("x"), Err("is not a number".into()));
        check(parse_count("8x"), Err("is not a number".into()));
        check(parse_count("99999999999999999999"), Err("is too large".into()));
        check(parse_count("99999999p"), Err("is too large".into()));
        check(parse_in_range("50", 1, 5000), Ok(50));
        check(parse_in_range("0", 1, 5000), Err("expected a whole number from 1 to 5000".into()));
        check(parse_in_range("-1", 1, 5000), Err("expected a whole number from 1 to 5000".into()));
        check(parse_time_minutes("UNLIMITED"), Ok(None));
        check(parse_time_minutes("90"), Ok(Some(90)));
        check(parse_time_minutes("1:01"), Ok(Some(2)));
        check(parse_time_minutes("2:00:00"), Ok(Some(120)));
        check(parse_time_minutes("1-0"), Ok(Some(1440)));
        check(parse_time_minutes("1-2:30"), Ok(Some(1590)));
        check(parse_time_minutes("1-2:30:01"), Ok(Some(1591)));
        check(
            parse_time_minutes("1:2:3:4"),
            Err("\"1:2:3:4\" is not a time limit (minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED)".into()),
        );
        assert!(parse_time_minutes("abc").is_err());
        assert!(parse_time_minutes("999999999-0").is_err());
    }
}
