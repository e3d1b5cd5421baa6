//! Parses feed files and prints a one-line summary each (or the error with
//! its line): `check_feeds <file>...`. A file is read as a carbon series when
//! its header says so, as an egress matrix when its first cell is empty
//! (provider = the file name up to the first `_`), else as a price table.

use fleet_engine::feeds::{CARBON_HEADER, PRICES_HEADER};
use fleet_engine::{parse_carbon, parse_egress, parse_prices};

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                println!("{path}: {e}");
                failed = true;
                continue;
            }
        };
        let first = text.lines().next().unwrap_or("");
        let res = if first.trim() == CARBON_HEADER {
            parse_carbon(&text).map(|s| {
                let mean = s.direct.iter().sum::<f64>() / s.len().max(1) as f64;
                format!("carbon {} {} rows step {} s, mean direct {:.0} g/kWh", s.zone, s.len(), s.step_s, mean)
            })
        } else if first.starts_with(',') {
            let name = std::path::Path::new(&path).file_name().and_then(|n| n.to_str()).unwrap_or("");
            let provider = name.split('_').next().unwrap_or("");
            parse_egress(provider, &text).map(|m| format!("egress {} {} regions", m.provider, m.regions.len()))
        } else if first.trim() == PRICES_HEADER {
            parse_prices(&text)
                .map(|t| format!("prices {} keys, {} fractional rows skipped", t.entries.len(), t.skipped_fractional))
        } else {
            Err(fleet_engine::FeedError { line: 1, msg: "unknown feed format".into() })
        };
        match res {
            Ok(s) => println!("{path}: {s}"),
            Err(e) => {
                failed = true;
                println!("{path}:{e}");
            }
        }
    }
    std::process::exit(i32::from(failed));
}
