//! Table tests of the parsers: durations, #FLEET directives, JobSpec from a
//! request, policies, price / carbon / egress feeds.

use fleet_api::{FleetMode, FleetOptions, GpuRequest, GpuScope, JobRequest};
use fleet_engine::feeds::{parse_datetime_utc, PRICES_HEADER};
use fleet_engine::{
    parse_carbon, parse_duration, parse_egress, parse_prices, Directives, JobSpec, Parallelism, Policies, Policy,
};

#[test]
fn durations() {
    fn check(input: &str, expected: Option<f64>) {
        assert_eq!(parse_duration(input), expected, "{input:?}");
    }
    check("90s", Some(90.0));
    check("30m", Some(1800.0));
    check("2h", Some(7200.0));
    check("1h30m", Some(5400.0));
    check("1d", Some(86400.0));
    check("90", Some(5400.0)); // bare number = minutes, as sbatch --time
    check("01:30:00", Some(5400.0));
    check("10:30", Some(630.0)); // MM:SS
    check("2-00:00:00", Some(2.0 * 86400.0));
    check("1-2", Some(86400.0 + 7200.0));
    check("", None);
    check("abc", None);
    check("2x", None);
    check("5h3", None);
    check("1:2:3:4", None);
    check("-5", None);
}

#[test]
fn directives() {
    fn check(script: &str, expected: Directives, errors: &[usize]) {
        let (d, errs) = Directives::parse(script);
        assert_eq!(d, expected, "{script}");
        assert_eq!(errs.iter().map(|e| e.line).collect::<Vec<_>>(), errors, "{errs:?}");
    }
    check("#!/bin/bash\necho hi\n", Directives::default(), &[]);
    check(
        "#!/bin/bash\n#FLEET parallelism=tp estimate=2h\n#FLEET ckpt-interval=30m ckpt=s3://c/ ckpt-size=20\n\
         #FLEET dataset=s3://a/,s3://b/\n#FLEET gpu-types=h100,h200 region-deny=eu-* region-allow=aws:*\n\
         #FLEET max-price=3.5 interruptible to=x,y priority=5 gang=false mode=remote min-gpu=a100\n\
         #FLEET ckpt-signal=sigusr1\n",
        Directives {
            parallelism: Some(Parallelism::Tp),
            estimate_s: Some(7200.0),
            ckpt_interval_s: Some(1800.0),
            ckpt: Some("s3://c/".into()),
            ckpt_size_gb: Some(20.0),
            datasets: vec!["s3://a/".into(), "s3://b/".into()],
            gpu_types: vec!["H100".into(), "H200".into()],
            region_allow: vec!["aws:*".into()],
            region_deny: vec!["eu-*".into()],
            max_price: Some(3.5),
            interruptible: Some(true),
            to: vec!["x".into(), "y".into()],
            priority: Some(5),
            gang: Some(false),
            mode: Some(FleetMode::Remote),
            min_gpu: Some("A100".into()),
            ckpt_signal: Some("USR1".into()),
        },
        &[],
    );
    // A checkpoint signal is a plain name, at most 8 letters or digits.
    check("#FLEET ckpt-signal=USR2\n", Directives { ckpt_signal: Some("USR2".into()), ..Directives::default() }, &[]);
    check("#FLEET ckpt-signal=US$R1\n#FLEET ckpt-signal=\n", Directives::default(), &[1, 2]);
    // Errors carry line numbers; good keys on the same line survive.
    check(
        "#FLEET parallelism=pipeline estimate=1h\n#FLEET bogus=1\n#FLEETX ignored=1\n  #FLEET max-price=-1 dataset=\n",
        Directives { estimate_s: Some(3600.0), ..Directives::default() },
        &[1, 2, 4, 4],
    );
}

fn request() -> JobRequest {
    JobRequest {
        origin: "beta".into(),
        user_id: 1000,
        name: Some("train".into()),
        account: Some("ml".into()),
        min_nodes: Some(2),
        time_limit_min: Some(240),
        gpus: vec![GpuRequest { gpu_type: Some("h100".into()), count: 8, scope: GpuScope::Node }],
        fleet: FleetOptions {
            mode: FleetMode::Auto,
            to: vec![],
            max_price: Some(4.0),
            data: vec!["s3://d/".into()],
            ckpt: None,
            resume_from: None,
            interruptible: false,
            image: None,
            epoch: 0,
            start_gated: false,
        },
        ..JobRequest::default()
    }
}

#[test]
fn job_spec_from_request() {
    fn check(req: JobRequest, script: &str, expected: JobSpec) {
        let (d, errs) = Directives::parse(script);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(JobSpec::from_request(&req, &d), expected);
    }
    let base = JobSpec {
        id: "train".into(),
        gpu_types: vec!["H100".into()],
        gpus: 16,
        nodes: Some(2),
        duration_s: 4.0 * 3600.0,
        time_limit_s: Some(4.0 * 3600.0),
        datasets: vec!["s3://d/".into()],
        max_price: Some(4.0),
        home: "beta".into(),
        account: Some("ml".into()),
        ..JobSpec::default()
    };
    check(request(), "", base.clone());
    // Directives fill what the options leave open; options win on conflict.
    check(
        request(),
        "#FLEET estimate=2h max-price=9 dataset=s3://d/,s3://e/ parallelism=fsdp interruptible ckpt-interval=15m gpu-types=h100,h200\n",
        JobSpec {
            duration_s: 7200.0,
            datasets: vec!["s3://d/".into(), "s3://e/".into()],
            parallelism: Parallelism::Fsdp,
            interruptible: true,
            ckpt_interval_s: Some(900.0),
            gpu_types: vec!["H100".into(), "H200".into()],
            ..base.clone()
        },
    );
    // An estimate longer than the limit is capped by the limit.
    check(request(), "#FLEET estimate=10h\n", base.clone());
    // No time limit, no estimate: one hour.
    let mut r = request();
    r.time_limit_min = None;
    check(r, "", JobSpec { duration_s: 3600.0, time_limit_s: None, ..base.clone() });
    // The script travels in the request.
    let mut r = request();
    r.script = Some(b"#!/bin/sh\n#FLEET parallelism=tp\n#FLEET nope\n".to_vec());
    let (spec, errs) = JobSpec::from_request_script(&r);
    assert_eq!(spec.parallelism, Parallelism::Tp);
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].line, 3);
}

#[test]
fn policies_from_toml() {
    fn check(input: &str, expected: Result<&[(&str, f64, f64, bool)], &str>) {
        match (Policies::from_toml_str(input), expected) {
            (Ok(p), Ok(want)) => {
                for &(name, tv, cp, spot) in want {
                    let x = p.get(name).unwrap_or_else(|| panic!("{name} missing"));
                    assert_eq!(
                        (x.name.as_str(), x.time_value_usd_per_gpu_hour, x.carbon_usd_per_kg, x.allow_spot),
                        (name, tv, cp, spot)
                    );
                }
            }
            (Err(e), Err(frag)) => assert!(e.to_string().contains(frag), "{e}"),
            (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
        }
    }
    check("", Ok(&[("cost", 2.0, 0.0, true), ("time", 20.0, 0.0, false), ("green", 2.0, 1.0, true)]));
    check(
        "[server]\nport = 1\n[policies.cost]\ntime_value_usd_per_gpu_hour = 1.5\n[policies.night]\ncarbon_usd_per_kg = 0.3\n",
        Ok(&[("cost", 1.5, 0.0, true), ("night", 2.0, 0.3, true), ("green", 2.0, 1.0, true)]),
    );
    // Errors name the file (`<policies>` without one), line and column.
    check("[policies.cost]\ncarbon_usd_per_kg = -1\n", Err("<policies>:1:1: policy cost: carbon_usd_per_kg"));
    check("[policies.cost]\nnope = 1\n", Err("<policies>:2:1: unknown field `nope`"));
    check("[policies.cost]\nallow_spot = 3\n", Err("<policies>:2:14: invalid type"));
    check("[policies.cost]\nspot_max_reclaims = -1\n", Err("<policies>:2:21:"));
    check("[policies.green]\nspot_max_lost_h = inf\n", Err("policy green: spot_max_lost_h"));
    check("[policies.cost]\ntime_value_usd_per_job_hour = -2\n", Err("policy cost: time_value_usd_per_job_hour"));
    check("[policies\n", Err("<policies>:1:"));
    check("[policies]\ncost = 1\n", Err("<policies>:2:8: invalid type"));
    // A typo three tables down, in another file.
    let text = "[server]\nport = 1\n\n[policies.cost]\nspot_queue = false\n\n[policies.night]\nspot_max_reclaim = 2\n";
    let e = Policies::from_toml_named(text, "metasched.toml").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("metasched.toml:8:1: unknown field `spot_max_reclaim`, expected one of"), "{e}");
    // The new keys are read (and the rest comes from the built-in).
    let p =
        Policies::from_toml_str("[policies.cost]\nspot_max_reclaims = 2\nspot_max_lost_h = 1.5\nspot_queue = false\n")
            .unwrap_or_else(|e| panic!("{e}"));
    let c = p.get("cost").cloned().unwrap_or_default();
    assert_eq!((c.spot_max_reclaims, c.spot_max_lost_h, c.spot_queue), (2, 1.5, false));
    assert_eq!(c.time_value_usd_per_gpu_hour, Policy::cost().time_value_usd_per_gpu_hour);
    // The time value per job-hour: 0 in the built-ins, set alone it keeps the per-GPU one.
    let p = Policies::from_toml_str("[policies.cost]\ntime_value_usd_per_job_hour = 12.0\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let c = p.get("cost").cloned().unwrap_or_default();
    assert_eq!((c.time_value_usd_per_gpu_hour, c.time_value_usd_per_job_hour), (2.0, 12.0));
    assert_eq!((c.time_value(1), c.time_value(8)), (14.0, 3.5));
    assert_eq!(Policy::cost().time_value(8), Policy::cost().time_value_usd_per_gpu_hour);
}

#[test]
fn every_policy_key_is_accepted() {
    // Each field of `Policy` (as serialized) is a key a policy table may set.
    for base in [Policy::cost(), Policy::time(), Policy::green()] {
        let mut t = toml::Table::try_from(&base).unwrap_or_default();
        assert!(t.len() >= 8, "{t:?}");
        // Flip every value so that reading it back proves it was read.
        for (_, v) in t.iter_mut() {
            let flipped = match &*v {
                toml::Value::Boolean(b) => toml::Value::Boolean(!*b),
                toml::Value::Float(f) => toml::Value::Float(*f + 0.5),
                toml::Value::Integer(i) => toml::Value::Integer(*i + 1),
                other => other.clone(),
            };
            *v = flipped;
        }
        let mut doc = toml::Table::new();
        let mut ps = toml::Table::new();
        ps.insert(base.name.clone(), toml::Value::Table(t.clone()));
        doc.insert("policies".into(), toml::Value::Table(ps));
        let text = toml::to_string(&doc).unwrap_or_default();
        let got = Policies::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let back = toml::Table::try_from(got.get(&base.name).cloned().unwrap_or_default()).unwrap_or_default();
        assert_eq!(back, t, "{text}");
    }
}

#[test]
fn prices() {
    let h = PRICES_HEADER;
    let good = format!(
        "{h}\naws,us-east-1,use1-az1,p5.48xlarge,H100,8,192,2048,55.04,14.5\n\
         aws,us-east-1,use1-az5,p5.48xlarge,H100,8,192,2048,55.04,14.246\n\
         aws,us-east-1,use1-az1,p5.4xlarge,H100,1,16,256,6.88,\n\
         aws,us-east-1,use1-az1,g6f.large,L4,0.125,2,8,0.2,0.1\n\
         gcp,us-central1,us-central1-a,,H100,8,,,33.60609,22.8008\n"
    );
    let t = parse_prices(&good).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.skipped_fractional, 1);
    let e = t.get("aws", "us-east-1", "h100", 8).unwrap_or_else(|| panic!("missing"));
    assert_eq!((e.on_demand, e.spot, e.on_demand_line, e.spot_line), (Some(6.88), Some(1.78075), 2, 3));
    let e = t.get("aws", "us-east-1", "H100", 1).unwrap_or_else(|| panic!("missing"));
    assert_eq!((e.on_demand, e.spot), (Some(6.88), None));
    // Unknown size: the cheapest over sizes.
    let e = t.get("aws", "us-east-1", "H100", 4).unwrap_or_else(|| panic!("missing"));
    assert_eq!(e.spot, Some(1.78075));
    assert!(t.get("gcp", "us-central1", "H100", 8).is_some_and(|e| e.accelerator_only));

    fn check_err(input: String, line: usize, frag: &str) {
        match parse_prices(&input) {
            Err(e) => {
                assert_eq!(e.line, line, "{e}");
                assert!(e.msg.contains(frag), "{e}");
            }
            Ok(_) => panic!("accepted {input:?}"),
        }
    }
    check_err(String::new(), 1, "empty");
    check_err("provider,region\n".into(), 1, "expected header");
    check_err(format!("{h}\naws,r,z,i,H100,8,1,1,1\n"), 2, "10 fields");
    check_err(format!("{h}\naws,r,z,i,H100,8,1,1,1,1\naws,r,z,i,H100,x,1,1,1,1\n"), 3, "gpu_count");
    check_err(format!("{h}\naws,r,z,i,H100,8,1,1,-3,1\n"), 2, "price_ondemand");
    check_err(format!("{h}\naws,r,z,i,H100,8,1,1,1,NaN\n"), 2, "price_spot");
    check_err(format!("{h}\n,r,z,i,H100,8,1,1,1,1\n"), 2, "required");
}

#[test]
fn carbon() {
    let good = "datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n\
                2023-01-01 00:00:00,GB,100,150\n2023-01-01 01:00:00,GB,200,250\n2023-01-01 02:00:00,GB,300,350\n";
    let s = parse_carbon(good).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.zone, "GB");
    assert_eq!(s.start_unix, 1_672_531_200.0);
    assert_eq!(s.step_s, 3600.0);
    let t0 = s.start_unix;
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(s.mean_between(t0, t0 + 3.0 * 3600.0, false), 200.0));
    assert!(close(s.mean_between(t0 + 1800.0, t0 + 5400.0, false), 150.0));
    assert!(close(s.mean_between(t0, t0 + 7200.0, true), 200.0));
    // Wraps around: one period later reads the same hours.
    assert!(close(s.mean_between(t0 + 3.0 * 3600.0, t0 + 4.0 * 3600.0, false), 100.0));
    // Before the start wraps backwards.
    assert!(close(s.mean_between(t0 - 3600.0, t0, false), 300.0));
    assert!(close(s.mean_between(t0 + 10.0, t0 + 10.0, false), 100.0));
    assert_eq!(parse_datetime_utc("1970-01-01 00:00:00"), Some(0.0));
    assert_eq!(parse_datetime_utc("2024-02-29 12:00:00"), Some(1_709_208_000.0));
    assert_eq!(parse_datetime_utc("2024-13-01 00:00:00"), None);

    fn check_err(input: &str, line: usize, frag: &str) {
        match parse_carbon(input) {
            Err(e) => {
                assert_eq!(e.line, line, "{e}");
                assert!(e.msg.contains(frag), "{e}");
            }
            Ok(_) => panic!("accepted {input:?}"),
        }
    }
    let h = "datetime_utc,zone,ci_direct_gco2_kwh,ci_lca_gco2_kwh\n";
    check_err("", 1, "empty");
    check_err(h, 2, "no rows");
    check_err(&format!("{h}2023-01-01 00:00:00,GB,1\n"), 2, "4 fields");
    check_err(&format!("{h}2023-01-01 00:00:00,GB,1,1\n2023-01-01 01:00:00,DE,1,1\n"), 3, "zone");
    check_err(
        &format!("{h}2023-01-01 00:00:00,GB,1,1\n2023-01-01 01:00:00,GB,1,1\n2023-01-01 03:00:00,GB,1,1\n"),
        4,
        "gap",
    );
    check_err(&format!("{h}2023-01-01 01:00:00,GB,1,1\n2023-01-01 00:00:00,GB,1,1\n"), 3, "increase");
    check_err(&format!("{h}yesterday,GB,1,1\n"), 2, "datetime");
    check_err(&format!("{h}2023-01-01 00:00:00,GB,x,1\n"), 2, "ci_direct");
}

#[test]
fn egress() {
    let good = ",a,b,c\nb,0.02,0,0.05\na,0,0.01,0.02\nc,0.09,0.09,0\n";
    let m = parse_egress("aws", good).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.regions, vec!["a", "b", "c"]);
    assert_eq!(m.lookup("a", "b"), Some(0.01));
    assert_eq!(m.lookup("b", "a"), Some(0.02));
    assert_eq!(m.lookup("c", "a"), Some(0.09));
    assert_eq!(m.lookup("a", "zz"), None);

    fn check_err(input: &str, line: usize, frag: &str) {
        match parse_egress("aws", input) {
            Err(e) => {
                assert_eq!(e.line, line, "{e}");
                assert!(e.msg.contains(frag), "{e}");
            }
            Ok(_) => panic!("accepted {input:?}"),
        }
    }
    check_err("", 1, "empty");
    check_err("a,b\n", 1, "empty cell");
    check_err(",a,a\n", 1, "repeated");
    check_err(",a,b\na,0,1\nb,0\n", 3, "3 fields");
    check_err(",a,b\na,0,1\nz,0,1\n", 3, "not among");
    check_err(",a,b\na,0,1\na,0,1\n", 3, "repeated");
    check_err(",a,b\na,0,x\nb,0,1\n", 2, "column 3");
    check_err(",a,b\na,0,1\n", 3, "no row for source \"b\"");
}

#[test]
fn feeds_update_the_model() {
    let m = fleet_engine::FleetModel::from_toml_str(
        r#"
[[clusters]]
name = "x"
provider = "aws"
region = "us-east-1"
prices = { H100 = { on_demand = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 1

[[clusters]]
name = "y"
provider = "aws"
region = "us-west-2"
prices = { H100 = { on_demand = 1.0 } }
[[clusters.pools]]
gpu_type = "H100"
gpus_per_node = 8
nodes = 1
"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let t = parse_prices(&format!("{PRICES_HEADER}\naws,us-east-1,z,p5.48xlarge,H100,8,1,1,55.04,14.246\n"))
        .unwrap_or_else(|e| panic!("{e}"));
    let m2 = m.with_prices(&t, false);
    assert_eq!(m2.clusters[0].pools[0].prices.on_demand, Some(6.88));
    assert_eq!(m2.clusters[0].pools[0].prices.spot, Some(1.78075));
    assert_eq!(m2.clusters[1].pools[0].prices.on_demand, Some(1.0));
    let e = parse_egress("aws", ",us-east-1,us-west-2\nus-east-1,0,0.02\nus-west-2,0.03,0\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let m3 = m.with_egress(&e);
    let (a, b) = (m3.clusters[0].region_id, m3.clusters[1].region_id);
    assert_eq!(m3.egress_usd_per_gb(b, a), 0.03);
    assert_eq!(m3.egress_usd_per_gb(a, b), 0.02);
}

#[test]
fn shipped_policy_file_parses() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conf/metasched-policies.toml");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let p = Policies::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.names().collect::<Vec<_>>(), vec!["cost", "green", "time"]);
    // The example is true: each table sets every key, to the built-in's value.
    for b in [Policy::cost(), Policy::time(), Policy::green()] {
        assert_eq!(p.get(&b.name), Some(&b), "{}", b.name);
        let keys = toml::Table::try_from(&b).unwrap_or_default();
        let file: toml::Table = text.parse().unwrap_or_default();
        let table = file.get("policies").and_then(|t| t.get(&b.name)).and_then(|t| t.as_table()).cloned();
        let written: Vec<&String> = table.as_ref().map(|t| t.keys().collect()).unwrap_or_default();
        assert_eq!(written, keys.keys().collect::<Vec<_>>(), "[policies.{}] lists every key", b.name);
    }
}

#[test]
fn fleet_toml_is_strict_with_file_and_line() {
    fn check(input: &str, expected: Result<usize, &str>) {
        match (fleet_engine::FleetModel::from_toml_named(input, "f.toml"), expected) {
            (Ok(m), Ok(n)) => {
                assert_eq!(m.clusters.len(), n);
            }
            // `…` separates fragments that must all appear (in order).
            (Err(e), Err(frag)) => {
                let text = e.to_string();
                let mut at = 0;
                for part in frag.split('…') {
                    match text[at..].find(part) {
                        Some(i) => at += i + part.len(),
                        None => panic!("{input}\n=> {text}\nwanted {frag}"),
                    }
                }
            }
            (got, want) => panic!("{input}: got {:?}, want {want:?}", got.map(|m| m.clusters.len())),
        }
    }
    let c = "[[clusters]]\nname = \"a\"\nprovider = \"p\"\nregion = \"r\"\nprices = { H100 = { on_demand = 1.0 } }\n\
             [[clusters.pools]]\ngpu_type = \"H100\"\ngpus_per_node = 8\nnodes = 1\n";
    check(c, Ok(1));
    check(&format!("{c}[[teams]]\nname = \"vc1\"\nhome = \"a\"\n"), Ok(1));
    // unknown tables and keys, top level and nested, name their line
    check(&format!("{c}[home_map]\nvc1 = \"a\"\n"), Err("f.toml:10:…: unknown field `home_map`"));
    check(&c.replace("[[clusters]]", "[[cluster]]"), Err("f.toml:1:"));
    check(&c.replace("[[clusters]]", "[[cluster]]"), Err("unknown field `cluster`"));
    check(&format!("[overhead]\nrestore_s = 1\n{c}"), Err("f.toml:1:"));
    check(&format!("[overheads]\nrestor_s = 1\n{c}"), Err("f.toml:2:…: unknown field `restor_s`"));
    check(&c.replace("nodes = 1", "nodes = 1\nnvlink = 8"), Err("f.toml:10:…: unknown field `nvlink`"));
    check(&c.replace("region = \"r\"", "region = \"r\"\nonprme = true"), Err("f.toml:5:…: unknown field `onprme`"));
    check(
        &format!("{c}[[teams]]\nname = \"vc1\"\nhome = \"a\"\nhomes = 1\n"),
        Err("f.toml:13:…: unknown field `homes`"),
    );
    check(&format!("{c}[gpu_models.H100]\nspeed = 2\n"), Err("f.toml:11:…: unknown field `speed`"));
    check(&c.replace("nodes = 1", "nodes = \"1\""), Err("f.toml:9:"));
    // inside a price table too, at the cluster and at a pool: a misspelt
    // price was silently left out (and, at a pool, the cluster's price used)
    check(&c.replace("on_demand = 1.0", "on_demand = 1.0, spto = 0.3"), Err("f.toml:5:…: unknown field `spto`"));
    check(
        &c.replace("nodes = 1", "nodes = 1\nprices = { on_demnad = 2.0 }"),
        Err("f.toml:10:…: unknown field `on_demnad`"),
    );
    // validation errors name the line of the cluster or team they are about
    check(
        &c.replace("nodes = 1", "nodes = 0"),
        Err("f.toml:2: cluster a: pool 0: gpus_per_node and nodes must be > 0"),
    );
    check(&c.replace("on_demand = 1.0", "on_demand = -1.0"), Err("prices must be finite"));
    // an owned GPU's running cost: beside `onprem`, at most it, on owned clusters only
    let owned = c.replace("region = \"r\"", "region = \"r\"\nonprem = true");
    check(&owned.replace("on_demand = 1.0", "onprem = 1.0, running = 0.1"), Ok(1));
    check(
        &owned.replace("on_demand = 1.0", "onprem = 1.0, running = 1.5"),
        Err("f.toml:2: cluster a: pool 0: prices: running 1.5 is above onprem 1"),
    );
    check(
        &owned.replace("on_demand = 1.0", "on_demand = 1.0, running = 0.1"),
        Err("pool 0: prices: running needs onprem"),
    );
    check(&owned.replace("on_demand = 1.0", "onprem = 1.0, running = -0.1"), Err("prices must be finite and >= 0"));
    check(
        &c.replace("on_demand = 1.0", "on_demand = 1.0, running = 0.1"),
        Err("running is the running cost of owned GPUs (onprem = true)"),
    );
    check(&format!("{c}{c}"), Err("duplicate cluster"));
    check(
        &format!("{c}[[teams]]\nname = \"vc1\"\nhome = \"zz\"\n"),
        Err("f.toml:11: team vc1: home \"zz\" is not a cluster"),
    );
    check(
        &format!("{c}[[teams]]\nname = \"vc1\"\nhome = \"a\"\n[[teams]]\nname = \"vc1\"\nhome = \"a\"\n"),
        Err("declared twice"),
    );
    check(&c.replace("H100", "X9"), Err("no built-in speed"));
    check(&format!("{}[gpu_models.X9]\nrelative_throughput = 0.5\n", c.replace("H100", "X9")), Ok(1));
    check(&format!("{c}[gpu_models.H100]\nrelative_throughput = -1\n"), Err("relative_throughput must be > 0"));
    check("", Err("no clusters"));
    check("[[datasets]]\nuri = \"s3://x/\"\nlocations = [\"us-east-1\"]\n", Err("no clusters"));
    check(&format!("{c}[[datasets]]\nuri = \"s3://x/\"\nlocations = [\"us-east-1\"]\n"), Err("provider:region"));
    // teams resolve to their declared home
    let m = fleet_engine::FleetModel::from_toml_named(&format!("{c}[[teams]]\nname = \"vc1\"\nhome = \"a\"\n"), "f")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.team_home("vc1"), Some(0));
    assert_eq!(m.team_home("vc2"), None);
}

#[test]
fn gpu_speeds_are_relative_to_the_reference() {
    let c = "[[clusters]]\nname = \"a\"\nprovider = \"p\"\nregion = \"r\"\nprices = { H100 = { on_demand = 1.0 }, A100 = { on_demand = 1.0 } }\n\
             [[clusters.pools]]\ngpu_type = \"H100\"\ngpus_per_node = 8\nnodes = 1\n\
             [[clusters.pools]]\ngpu_type = \"A100\"\ngpus_per_node = 8\nnodes = 1\n";
    let m = fleet_engine::FleetModel::from_toml_str(c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.clusters[0].pools[0].speed, 1.9);
    assert_eq!(m.clusters[0].pools[1].speed, 1.0);
    assert_eq!(m.speed_of("t4"), Some(0.15));
    let m = fleet_engine::FleetModel::from_toml_str(&format!(
        "reference_gpu = \"H100\"\n{c}[gpu_models.A100]\nrelative_throughput = 0.95\npower_w = 300\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.clusters[0].pools[0].speed, 1.0);
    assert!((m.clusters[0].pools[1].speed - 0.5).abs() < 1e-12);
    assert_eq!(m.clusters[0].pools[1].gpu_power_w, 300.0);
}
