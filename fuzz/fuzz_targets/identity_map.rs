#![no_main]
//! The `JobUserMap` file (`fleet_agent::identity::parse_map`): never
//! panics; an error names `file:line`; every rule holds only valid names
//! and the line it came from; the rules written back as a map file parse
//! to the same rules.
use fleet_agent::identity::parse_map;
use libfuzzer_sys::fuzz_target;

fn valid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let rules = match parse_map(&text, "fuzz.map") {
        Ok(r) => r,
        Err(e) => {
            assert!(format!("{e}").starts_with("fuzz.map:"), "error without file:line: {e}");
            return;
        }
    };
    let lines = text.lines().count();
    let mut again = String::new();
    for r in &rules {
        assert!(r.origin == "*" || valid(&r.origin), "{r:?}");
        assert!(valid(&r.user) && valid(&r.local), "{r:?}");
        assert!(r.account.as_deref().is_none_or(valid), "{r:?}");
        assert!(r.line >= 1 && r.line <= lines, "{r:?} of {lines} lines");
        again.push_str(&format!("{}:{} {} {}\n", r.origin, r.user, r.local, r.account.as_deref().unwrap_or("")));
    }
    let back = parse_map(&again, "again.map").expect("rules written back parse");
    assert_eq!(back.len(), rules.len());
    for (a, b) in rules.iter().zip(&back) {
        assert_eq!((&a.origin, &a.user, &a.local, &a.account), (&b.origin, &b.user, &b.local, &b.account));
    }
});
