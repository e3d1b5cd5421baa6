//! What every HTTP client of the meta-scheduler shares: reading the CA
//! bundle an https URL is verified against, and telling a URL that sends
//! tokens over the network in the clear. (Parsing it stays with the
//! clients' HTTP library, which the plugin, also built on this crate, must
//! not link.)

use std::path::Path;

/// The PEM text of a CA bundle (`MetaSchedulerCaFile`, `--ca-file`), to
/// hand to `reqwest::Certificate::from_pem_bundle`. An unreadable file, or
/// one without a certificate, is an error naming it.
pub fn read_ca_bundle(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("reading the CA bundle {}: {e}", path.display()))?;
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        return Err(format!("the CA bundle {} holds no PEM certificate", path.display()));
    }
    Ok(pem)
}

/// An `http://` URL whose host is not loopback.
pub fn cleartext_off_host(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    !(host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cleartext_off_host() {
        for (url, off) in [
            ("http://127.0.0.1:16900", false),
            ("http://localhost:1", false),
            ("http://[::1]:16900", false),
            ("https://meta.example:443", false),
            ("http://meta.example:16900", true),
            ("http://10.1.2.3:16900/", true),
            ("http://[2001:db8::1]:1", true),
        ] {
            assert_eq!(super::cleartext_off_host(url), off, "{url}");
        }
    }

    #[test]
    fn unreadable_and_empty_bundles_are_errors_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("fleet-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(super::read_ca_bundle(&dir.join("missing.pem")).unwrap_err().contains("missing.pem"));
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        assert!(super::read_ca_bundle(&empty).unwrap_err().contains("empty.pem holds no PEM certificate"));
        let one = dir.join("one.pem");
        std::fs::write(&one, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").unwrap();
        assert!(super::read_ca_bundle(&one).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
