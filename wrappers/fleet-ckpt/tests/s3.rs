//! Checkpoints through real S3-compatible servers: two "regions" (two
//! servers, one bucket each) on loopback. Skipped, with the reason
//! printed, only when no server binary is installed.

mod common;

use std::sync::Arc;

use common::{bytes, server_binary, stores_toml, write_tree, S3Server};
use fleet_ckpt::{CkptError, Client, Location, SaveOptions, Stores};
use object_store::{ObjectStore, PutPayload};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn loc(u: &str) -> Location {
    Location::parse(u).unwrap()
}

fn opts(step: Option<u64>, keep: usize) -> SaveOptions {
    SaveOptions { job_id: "f-test".into(), seq: None, step, keep }
}

struct Regions {
    _east: S3Server,
    _west: S3Server,
    stores: Stores,
    stores_text: String,
}

fn two_regions() -> Option<Regions> {
    let bin = server_binary()?;
    let east = S3Server::start(&bin, &["ckpt-east"]);
    let west = S3Server::start(&bin, &["ckpt-west"]);
    let stores_text = stores_toml(&[("ckpt-east", &east.endpoint), ("ckpt-west", &west.endpoint)]);
    let stores = Stores::parse(&stores_text).unwrap();
    Some(Regions { _east: east, _west: west, stores, stores_text })
}

fn raw_store(r: &Regions, url: &str) -> Arc<dyn ObjectStore> {
    r.stores.open(&loc(url)).unwrap()
}

#[test]
fn save_copy_corrupt_restore_across_two_regions() {
    let Some(r) = two_regions() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let v1 = [
        ("model.bin", bytes(1, 3_000_000)),
        ("opt/state.bin", bytes(2, 20_000_000)),
        ("meta.json", b"{\"step\":100}".to_vec()),
        ("empty.lock", Vec::new()),
    ];
    let v2 = [
        ("model.bin", bytes(3, 3_000_000)),
        ("opt/state.bin", bytes(4, 20_000_000)),
        ("meta.json", b"{\"step\":200}".to_vec()),
        ("empty.lock", Vec::new()),
    ];
    let (d1, d2) = (tmp.path().join("v1"), tmp.path().join("v2"));
    write_tree(&d1, &v1);
    write_tree(&d2, &v2);
    let east = loc("s3://ckpt-east/fleet/f-test");
    let west = loc("s3://ckpt-west/fleet/f-test");
    let client = Client::new(r.stores.clone());
    rt().block_on(async {
        let s1 = client.save(&d1, &east, &opts(Some(100), 0)).await.unwrap();
        let s2 = client.save(&d2, &east, &opts(Some(200), 0)).await.unwrap();
        assert_eq!((s1.manifest.seq, s2.manifest.seq), (1, 2));
        assert_eq!(s2.bytes, 23_000_000 + 12);
        assert_eq!(s2.location.url(), "s3://ckpt-east/fleet/f-test/ckpt-000000000002");
        let listed = client.list(&east).await.unwrap();
        assert_eq!(listed.iter().map(|e| (e.seq, e.is_valid())).collect::<Vec<_>>(), vec![(1, true), (2, true)]);

        // Cross-region copy of the newest: digests checked, same manifest.
        let c = client.copy(&east, &west).await.unwrap();
        assert_eq!(c.location.url(), "s3://ckpt-west/fleet/f-test/ckpt-000000000002");
        assert_eq!(c.bytes, s2.bytes);
        assert_eq!(c.manifest_sha256, s2.manifest_sha256);
        let v = client.verify(&c.location).await.unwrap();
        assert_eq!(v.manifest_sha256, s2.manifest_sha256);

        // Corrupt one file of east's newest, keeping its size: the cheap
        // listing still sees it whole, the digests do not.
        let mut bad = bytes(4, 20_000_000);
        bad[12_345_678] ^= 0xff;
        raw_store(&r, "s3://ckpt-east").put(&s2.location.object("opt/state.bin"), PutPayload::from(bad)).await.unwrap();
        match client.verify(&s2.location).await {
            Err(CkptError::Torn { file, why, .. }) => {
                assert_eq!(file, "opt/state.bin");
                assert!(why.contains("sha256"), "{why}");
            }
            other => panic!("verify of a corrupted checkpoint: {other:?}"),
        }
        // Restore from east's prefix falls back to seq 1, saying why.
        let out = tmp.path().join("restored-east");
        let got = client.restore(&east, &out).await.unwrap();
        assert_eq!(got.manifest.seq, 1);
        assert_eq!(got.skipped.len(), 1);
        assert!(
            got.skipped[0].contains("opt/state.bin") && got.skipped[0].contains("ckpt-000000000002"),
            "{:?}",
            got.skipped
        );
        assert_eq!(std::fs::read(out.join("opt/state.bin")).unwrap(), v1[1].1);
        assert_eq!(std::fs::read(out.join("meta.json")).unwrap(), v1[2].1);
        // The restored manifest is there for the job to read its step.
        let m = fleet_ckpt::Manifest::parse(&std::fs::read(out.join("fleet-ckpt.json")).unwrap()).unwrap();
        assert_eq!(m.step, Some(100));
        // Asking for the corrupted one by name is refused, naming the file;
        // nothing is left behind.
        let out2 = tmp.path().join("restored-explicit");
        let e = client.restore(&s2.location, &out2).await.unwrap_err().to_string();
        assert!(e.contains("torn checkpoint") && e.contains("\"opt/state.bin\""), "{e}");
        assert!(!out2.exists());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 3, "no staging directory left behind");
        // West's copy is intact: the newest there restores.
        let out3 = tmp.path().join("restored-west");
        let got = client.restore(&west, &out3).await.unwrap();
        assert_eq!(got.manifest.seq, 2);
        assert!(got.skipped.is_empty());
        assert_eq!(std::fs::read(out3.join("opt/state.bin")).unwrap(), v2[1].1);
        assert_eq!(std::fs::read(out3.join("empty.lock")).unwrap(), b"", "an empty file is copied and restored");
        // A copy of the corrupted checkpoint is refused and leaves nothing
        // that could pass for a checkpoint.
        let west2 = loc("s3://ckpt-west/other");
        let e = client.copy(&s2.location, &west2).await.unwrap_err().to_string();
        assert!(e.contains("opt/state.bin"), "{e}");
        assert!(client.list(&west2).await.unwrap().iter().all(|e| !e.is_valid()));
    });
}

#[test]
fn torn_upload_is_ignored_and_retention_keeps_the_last_n() {
    let Some(r) = two_regions() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let east = loc("s3://ckpt-east/j2");
    let client = Client::new(r.stores.clone());
    let store = raw_store(&r, "s3://ckpt-east");
    rt().block_on(async {
        let d = tmp.path().join("d");
        write_tree(&d, &[("w.bin", bytes(9, 100_000))]);
        client.save(&d, &east, &opts(None, 0)).await.unwrap();
        // A torn upload: files of seq 2, no manifest (the job died mid-save).
        let torn = east.join("ckpt-000000000002");
        store.put(&torn.object("w.bin"), PutPayload::from(bytes(10, 50_000))).await.unwrap();
        let listed = client.list(&east).await.unwrap();
        assert!(matches!(listed[1].state, fleet_ckpt::EntryState::NoManifest));
        let out = tmp.path().join("r");
        let got = client.restore(&east, &out).await.unwrap();
        assert_eq!(got.manifest.seq, 1, "the torn upload is not a checkpoint");
        assert_eq!(client.resolve(&east).await.unwrap().name(), "ckpt-000000000001");
        // A manifest whose file is missing: invalid in the listing, skipped.
        let bad = east.join("ckpt-000000000003");
        let mut m = fleet_ckpt::Manifest::parse(&std::fs::read(out.join("fleet-ckpt.json")).unwrap()).unwrap();
        m.seq = 3;
        m.files[0].path = "missing.bin".into();
        store.put(&bad.object("fleet-ckpt.json"), PutPayload::from(m.to_bytes())).await.unwrap();
        let listed = client.list(&east).await.unwrap();
        match &listed[2].state {
            fleet_ckpt::EntryState::Invalid(why) => assert!(why.contains("\"missing.bin\" is missing"), "{why}"),
            s => panic!("{s:?}"),
        }
        // The next save goes after everything there, never over it.
        for i in 0..3 {
            write_tree(&d, &[("w.bin", bytes(20 + i, 100_000))]);
            client.save(&d, &east, &opts(None, 2)).await.unwrap();
        }
        let seqs: Vec<(u64, bool)> = client.list(&east).await.unwrap().iter().map(|e| (e.seq, e.is_valid())).collect();
        assert_eq!(seqs, vec![(5, true), (6, true)], "keep 2: older valid, torn and invalid ones are gone");
        let out = tmp.path().join("r2");
        client.restore(&east, &out).await.unwrap();
        assert_eq!(std::fs::read(out.join("w.bin")).unwrap(), bytes(22, 100_000));
    });
}

/// The binary end to end: save, list, verify, copy and restore through
/// the environment a job sees, and restore's exit code 3 when there is
/// nothing to restore.
#[test]
fn cli_through_the_job_environment() {
    let Some(r) = two_regions() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let stores = tmp.path().join("stores.toml");
    std::fs::write(&stores, &r.stores_text).unwrap();
    let run = |args: &[&str], envs: &[(&str, &str)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-ckpt"))
            .args(args)
            .env("FLEET_CKPT_STORES", &stores)
            .env_remove("FLEET_METASCHED_URL")
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let job_env = [("FLEET_CKPT_URL", "s3://ckpt-east/fleet/f-cli"), ("FLEET_JOB_ID", "f-cli")];
    let dir = tmp.path().join("work");
    write_tree(&dir, &[("a.bin", bytes(5, 10_000_000)), ("sub/b.txt", b"hello".to_vec())]);
    let d = dir.to_str().unwrap();

    let fresh = tmp.path().join("fresh");
    let (code, _, err) = run(&["restore", fresh.to_str().unwrap()], &job_env);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("start from scratch"), "{err}");

    let (code, out, err) = run(&["save", d, "--step", "7"], &job_env);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("saved s3://ckpt-east/fleet/f-cli/ckpt-000000000001 (2 files, 10000005 bytes"), "{out}");
    let (code, out, _) = run(&["--json", "list"], &job_env);
    assert_eq!(code, Some(0));
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!((row["seq"].as_u64(), row["valid"].as_bool(), row["step"].as_u64()), (Some(1), Some(true), Some(7)));
    let (code, out, err) = run(&["verify"], &job_env);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("valid s3://ckpt-east/fleet/f-cli/ckpt-000000000001"), "{out}");
    let (code, out, err) = run(&["--json", "copy", "s3://ckpt-east/fleet/f-cli", "s3://ckpt-west/fleet/f-cli"], &[]);
    assert_eq!(code, Some(0), "{err}");
    let c: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(c["bytes"].as_u64(), Some(10_000_005));
    assert_eq!(c["url"].as_str(), Some("s3://ckpt-west/fleet/f-cli/ckpt-000000000001"));
    // FLEET_RESUME_FROM names the copy in the other region.
    let back = tmp.path().join("back");
    let (code, _, err) = run(
        &["restore", back.to_str().unwrap()],
        &[("FLEET_RESUME_FROM", "s3://ckpt-west/fleet/f-cli/ckpt-000000000001")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(std::fs::read(back.join("a.bin")).unwrap(), bytes(5, 10_000_000));
    assert_eq!(std::fs::read(back.join("sub/b.txt")).unwrap(), b"hello");
    // A wrong URL is a usage-level error naming it.
    let (code, _, err) = run(&["list", "--url", "gs://x/y"], &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("\"gs://x/y\"") && err.contains("expected s3://"), "{err}");
}

/// Save, copy and restore figures for a checkpoint of FLEET_CKPT_BENCH_MB
/// megabytes (default 32; the report's figures use 200 in a release build).
#[test]
fn throughput() {
    let Some(r) = two_regions() else { return };
    let mb: usize = std::env::var("FLEET_CKPT_BENCH_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(32);
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("big");
    let files: Vec<(String, Vec<u8>)> =
        (0..4).map(|i| (format!("shard-{i}.bin"), bytes(100 + i, mb * 250_000))).collect();
    let refs: Vec<(&str, Vec<u8>)> = files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    write_tree(&d, &refs);
    drop(refs);
    let client = Client::new(r.stores.clone());
    let (east, west) = (loc("s3://ckpt-east/bench"), loc("s3://ckpt-west/bench"));
    rt().block_on(async {
        let s = client.save(&d, &east, &opts(None, 0)).await.unwrap();
        let c = client.copy(&east, &west).await.unwrap();
        let out = tmp.path().join("out");
        let re = client.restore(&west, &out).await.unwrap();
        assert_eq!(std::fs::read(out.join("shard-3.bin")).unwrap(), files[3].1);
        assert_eq!((s.bytes, c.bytes, re.bytes), ((mb * 1_000_000) as u64, (mb * 1_000_000) as u64, (mb * 1_000_000) as u64));
        let rate = |b: u64, s: f64| b as f64 / 1e6 / s;
        eprintln!(
            "throughput ({mb} MB, 4 files, moto): save {:.1} MB/s ({:.2} s), copy east->west {:.1} MB/s ({:.2} s), restore {:.1} MB/s ({:.2} s)",
            rate(s.bytes, s.secs), s.secs, rate(c.bytes, c.secs), c.secs, rate(re.bytes, re.secs), re.secs
        );
    });
}
