//! The convention on the local filesystem store (file://): no server
//! needed, so these always run. Hostile manifests and directories.

mod common;

use common::{bytes, write_tree};
use fleet_ckpt::{Client, Location, Manifest, SaveOptions, Stores};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn file_url(p: &std::path::Path) -> Location {
    Location::parse(&format!("file://{}", p.display())).unwrap()
}

fn save_opts() -> SaveOptions {
    SaveOptions { job_id: "f-local".into(), seq: None, step: None, keep: 0 }
}

/// Plant a checkpoint with a hand-written manifest (as an attacker with
/// write access to the bucket would).
fn plant(store_root: &std::path::Path, seq: u64, files: &[(&str, &[u8])], manifest_paths: &[&str]) {
    let dir = store_root.join(format!("ckpt-{seq:012}"));
    for (rel, data) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let entries: Vec<serde_json::Value> = manifest_paths
        .iter()
        .map(|p| serde_json::json!({"path": p, "size": 3, "sha256": fleet_ckpt::manifest::sha256_hex(b"pwn")}))
        .collect();
    let m =
        serde_json::json!({"format": "fleet-ckpt/1", "job_id": "x", "seq": seq, "created_at": "t", "files": entries});
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("fleet-ckpt.json"), serde_json::to_vec(&m).unwrap()).unwrap();
}

#[test]
fn manifest_paths_never_escape_the_restore_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let client = Client::new(Stores::default());
    for (i, evil) in ["../escaped", "/tmp/escaped-abs", "a/../../escaped", "./a", "a//b"].iter().enumerate() {
        let seq = i as u64 + 1;
        plant(&root, seq, &[], &[evil]);
        let ckpt = file_url(&root).join(&format!("ckpt-{seq:012}"));
        let dest = tmp.path().join(format!("dest{seq}"));
        let e = rt().block_on(client.restore(&ckpt, &dest)).unwrap_err().to_string();
        assert!(e.contains("unsafe") && e.contains(&format!("{evil:?}")), "{evil}: {e}");
        assert!(!dest.exists());
    }
    assert!(!tmp.path().join("escaped").exists() && !std::path::Path::new("/tmp/escaped-abs").exists());
    // The prefix as a whole: nothing valid, every reason listed.
    let e = rt().block_on(client.restore(&file_url(&root), &tmp.path().join("d"))).unwrap_err().to_string();
    assert!(e.starts_with("no valid checkpoint under file://") && e.contains("'..' component escapes"), "{e}");
}

#[test]
fn symlinks_are_refused_on_both_sides() {
    let tmp = tempfile::tempdir().unwrap();
    let client = Client::new(Stores::default());
    let store = file_url(&tmp.path().join("store"));
    // Saving: a symlink in the directory is named, nothing is uploaded.
    let src = tmp.path().join("src");
    write_tree(&src, &[("ok.bin", bytes(1, 1000))]);
    std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
    let e = rt().block_on(client.save(&src, &store, &save_opts())).unwrap_err().to_string();
    assert!(e.contains("link is a symbolic link"), "{e}");
    std::fs::remove_file(src.join("link")).unwrap();
    let saved = rt().block_on(client.save(&src, &store, &save_opts())).unwrap();
    // Restoring: into a symlink, or into a non-empty directory, is refused.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = tmp.path().join("dest-link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let e = rt().block_on(client.restore(&store, &link)).unwrap_err().to_string();
    assert!(e.contains("is a symbolic link"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    std::fs::write(elsewhere.join("keep"), b"x").unwrap();
    let e = rt().block_on(client.restore(&store, &elsewhere)).unwrap_err().to_string();
    assert!(e.contains("is not empty"), "{e}");
    // A planted file whose directory component is a symlink in the store
    // is read as the store reads it, but written only into our own fresh
    // staging directory: the restored tree holds regular files only.
    let dest = tmp.path().join("dest");
    let r = rt().block_on(client.restore(&saved.location, &dest)).unwrap();
    assert_eq!(r.manifest.files.len(), 1);
    assert!(std::fs::symlink_metadata(dest.join("ok.bin")).unwrap().is_file());
}

/// A copy between regions runs as the agent, over checkpoints the job
/// wrote as its user: a file of a local store that is a symbolic link (to
/// the agent's own files, say), or sits below one, or is a hard link, is
/// never read, even with a manifest that names its true size and digest;
/// nothing of it reaches the destination.
#[test]
fn a_copy_reads_no_symlinked_or_hard_linked_file_of_a_local_store() {
    let tmp = tempfile::tempdir().unwrap();
    let client = Client::new(Stores::default());
    let secret = tmp.path().join("agent-journal.db");
    let data = bytes(7, 9_000_000); // over one part: the multipart path
    std::fs::write(&secret, &data).unwrap();
    let entry =
        serde_json::json!({"path": "big", "size": data.len(), "sha256": fleet_ckpt::manifest::sha256_hex(&data)});
    let manifest =
        serde_json::json!({"format": "fleet-ckpt/1", "job_id": "x", "seq": 1, "created_at": "t", "files": [entry]});
    let root = tmp.path().join("store");
    let plant = |seq: u64, how: &dyn Fn(&std::path::Path)| {
        let dir = root.join(format!("ckpt-{seq:012}"));
        std::fs::create_dir_all(&dir).unwrap();
        how(&dir);
        std::fs::write(dir.join("fleet-ckpt.json"), serde_json::to_vec(&manifest).unwrap()).unwrap();
        file_url(&root).join(&format!("ckpt-{seq:012}"))
    };
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::hard_link(&secret, outside.join("big")).unwrap();
    let cases = [
        plant(1, &|d| std::os::unix::fs::symlink(&secret, d.join("big")).unwrap()),
        // The file is regular, a directory above it is a link.
        plant(2, &|d| {
            std::fs::remove_dir(d).unwrap();
            std::os::unix::fs::symlink(&outside, d).unwrap();
        }),
        plant(3, &|d| std::fs::hard_link(&secret, d.join("big")).unwrap()),
    ];
    for (i, src) in cases.iter().enumerate() {
        let dst = file_url(&tmp.path().join(format!("west{i}")));
        let e = rt().block_on(client.copy(src, &dst)).unwrap_err().to_string();
        assert!(e.contains("file \"big\" cannot be read safely"), "case {i}: {e}");
        let written: Vec<_> = walk(&tmp.path().join(format!("west{i}")));
        assert!(written.is_empty(), "case {i}: {written:?}");
    }
    // The same bytes as a regular file of the checkpoint: copied.
    let ok = plant(4, &|d| std::fs::write(d.join("big"), &data).unwrap());
    let dst = file_url(&tmp.path().join("west-ok"));
    rt().block_on(client.copy(&ok, &dst)).unwrap();
}

/// Every file under `dir` (none when it does not exist).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

#[test]
fn local_round_trip_resave_and_tamper() {
    let tmp = tempfile::tempdir().unwrap();
    let client = Client::new(Stores::default());
    let store_dir = tmp.path().join("store");
    let store = file_url(&store_dir);
    let src = tmp.path().join("src");
    write_tree(&src, &[("a", bytes(1, 5)), ("d/e/f", bytes(2, 9_000_000)), ("empty", Vec::new())]);
    let s1 = rt().block_on(client.save(&src, &store, &save_opts())).unwrap();
    assert_eq!(s1.manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["a", "d/e/f", "empty"]);
    // A restored directory (with its manifest) can be saved again: the old
    // manifest is not a file of the new checkpoint.
    let back = tmp.path().join("back");
    rt().block_on(client.restore(&store, &back)).unwrap();
    let s2 = rt().block_on(client.save(&back, &store, &save_opts())).unwrap();
    assert_eq!(s2.manifest.seq, 2);
    assert_eq!(s2.manifest.files, s1.manifest.files);
    // A checkpoint is never overwritten.
    let e =
        rt().block_on(client.save(&src, &store, &SaveOptions { seq: Some(2), ..save_opts() })).unwrap_err().to_string();
    assert!(e.contains("already holds a checkpoint"), "{e}");
    // A truncated file: the listing sees the size, restore falls back.
    std::fs::write(store_dir.join("ckpt-000000000002/d/e/f"), b"short").unwrap();
    let listed = rt().block_on(client.list(&store)).unwrap();
    assert!(!listed[1].is_valid());
    let out = tmp.path().join("out");
    let r = rt().block_on(client.restore(&store, &out)).unwrap();
    assert_eq!(r.manifest.seq, 1);
    assert_eq!(std::fs::read(out.join("d/e/f")).unwrap(), bytes(2, 9_000_000));
    let m = Manifest::parse(&std::fs::read(out.join("fleet-ckpt.json")).unwrap()).unwrap();
    assert_eq!(m.seq, 1);
}
