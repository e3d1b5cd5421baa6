//! The meta-scheduler over HTTPS (`[tls]`), with a CA and a server
//! certificate minted for the test (rcgen).

use std::path::Path;

use fleet_metasched::config::{Config, TlsConfig};

/// A CA and a certificate for 127.0.0.1/localhost signed by it; returns
/// the CA's PEM and the config's `[tls]`.
fn mint(dir: &Path, name: &str) -> (String, TlsConfig) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, format!("{name} CA"));
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
    let tls = TlsConfig { cert_file: dir.join(format!("{name}.pem")), key_file: dir.join(format!("{name}.key")) };
    std::fs::write(&tls.cert_file, leaf.pem()).unwrap();
    std::fs::write(&tls.key_file, key.serialize_pem()).unwrap();
    (ca.pem(), tls)
}

fn config(dir: &Path, tls: Option<TlsConfig>) -> Config {
    std::fs::write(dir.join("admin.token"), "admin-secret").unwrap();
    Config { tls, ..Config::new("127.0.0.1:0".parse().unwrap(), dir.join("state"), dir.join("admin.token")) }
}

fn client_trusting(ca_pem: &str) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap();
    reqwest::Client::builder().add_root_certificate(ca).build().unwrap()
}

#[tokio::test]
async fn serves_https_to_clients_that_trust_its_ca_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca_pem, tls) = mint(tmp.path(), "fleet");
    let (other_ca, _) = mint(tmp.path(), "other");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fleet_metasched::run(listener, config(tmp.path(), Some(tls)), async {
        let _ = rx.await;
    }));

    let https = format!("https://127.0.0.1:{port}");
    let ok = client_trusting(&ca_pem);
    let health = ok.get(format!("{https}/health")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    // Tokens work as over HTTP: the admin lists the (empty) job table,
    // a wrong token is refused.
    let jobs = ok.get(format!("{https}/v1/jobs")).bearer_auth("admin-secret").send().await.unwrap();
    assert_eq!(jobs.status(), 200);
    assert_eq!(jobs.text().await.unwrap(), "[]");
    let bad = ok.get(format!("{https}/v1/jobs")).bearer_auth("guess").send().await.unwrap();
    assert_eq!(bad.status(), 401);
    // A client that trusts another CA does not get through the handshake,
    // and plain HTTP gets no answer.
    let err = client_trusting(&other_ca).get(format!("{https}/health")).send().await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert!(reqwest::Client::new().get(format!("http://127.0.0.1:{port}/health")).send().await.is_err());

    // A client offering HTTP/2 first is answered in HTTP/1.1 (ALPN): no
    // streams to multiply what one connection holds.
    use rustls::pki_types::pem::PemObject as _;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap();
    let alpn = tokio::task::spawn_blocking(move || {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        conn.alpn_protocol().map(<[u8]>::to_vec)
    })
    .await
    .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_bad_certificate_is_a_startup_error_naming_the_files() {
    let tmp = tempfile::tempdir().unwrap();
    let tls = TlsConfig { cert_file: tmp.path().join("missing.pem"), key_file: tmp.path().join("missing.key") };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = fleet_metasched::run(listener, config(tmp.path(), Some(tls)), std::future::pending()).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("[tls]") && msg.contains("missing.pem") && msg.contains("missing.key"), "{msg}");

    let (_, mut tls) = mint(tmp.path(), "fleet");
    std::fs::write(&tls.key_file, "not a key").unwrap();
    tls.cert_file = tmp.path().join("fleet.pem");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = fleet_metasched::run(listener, config(tmp.path(), Some(tls)), std::future::pending()).await.unwrap_err();
    assert!(format!("{err:#}").contains("fleet.key"), "{err:#}");
}
