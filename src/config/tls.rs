//! The TLS files, read and checked at start. A file that cannot work is a usage error (64)
//! that names it: found only at the handshake, it read as "etcd unavailable" (69), which
//! scripts and `Restart=always` retry forever.

use std::path::Path;

use anyhow::Result;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::etcd::Tls;
use crate::exit::{fail, Exit};

/// Checks the endpoints' schemes against TLS, and each file for what its flag needs.
pub fn check(tls: &Tls, endpoints: &[String]) -> Result<()> {
    if let Some(e) = endpoints.iter().find(|e| e.starts_with("http://")) {
        let why = if tls.cacert.is_some() || tls.cert.is_some() {
            "--cacert and --cert are for TLS"
        } else {
            "another endpoint is https://"
        };
        return Err(usage(format!(
            "--endpoints: '{e}' is plain http://, but {why}; use https://"
        )));
    }
    if let Some(path) = &tls.cacert {
        let pem = read("--cacert", path)?;
        if certificates(&pem) == 0 {
            return Err(usage(match has_key(&pem) {
                true => format!(
                    "--cacert {}: holds a private key, not the CA's certificate",
                    path.display()
                ),
                false => no_pem("--cacert", path, "CERTIFICATE"),
            }));
        }
    }
    if let Some(path) = &tls.cert {
        let pem = read("--cert", path)?;
        let Some(first) = CertificateDer::pem_slice_iter(&pem).flatten().next() else {
            return Err(usage(match has_key(&pem) {
                true => format!(
                    "--cert {}: holds a private key, not a certificate (are --cert and --key swapped?)",
                    path.display()
                ),
                false => no_pem("--cert", path, "CERTIFICATE"),
            }));
        };
        match x509_version(&first) {
            Some(3) => {}
            Some(v) => {
                return Err(usage(format!(
                    "--cert {}: an X.509 v{v} certificate; the TLS library takes only v3 client certificates: reissue it with extensions (`openssl x509 -req ... -copy_extensions copy`, or `-extfile` with `basicConstraints=CA:FALSE`)",
                    path.display()
                )))
            }
            None => {
                return Err(usage(format!(
                    "--cert {}: the certificate cannot be read",
                    path.display()
                )))
            }
        }
    }
    if let Some(path) = &tls.key {
        let pem = read("--key", path)?;
        if !has_key(&pem) {
            return Err(usage(match certificates(&pem) > 0 {
                true => format!(
                    "--key {}: holds a certificate, not a private key (are --cert and --key swapped?)",
                    path.display()
                ),
                false => no_pem("--key", path, "PRIVATE KEY"),
            }));
        }
    }
    Ok(())
}

fn usage(message: String) -> anyhow::Error {
    fail(Exit::Usage, message)
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| usage(format!("{flag} {}: {e}", path.display())))
}

fn no_pem(flag: &str, path: &Path, what: &str) -> String {
    format!(
        "{flag} {}: no PEM {what} in it (-----BEGIN {what}-----)",
        path.display()
    )
}

fn certificates(pem: &[u8]) -> usize {
    CertificateDer::pem_slice_iter(pem).flatten().count()
}

fn has_key(pem: &[u8]) -> bool {
    PrivateKeyDer::from_pem_slice(pem).is_ok()
}

/// One DER element: its tag, its contents, and what follows it.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |l, &x| (l << 8) | usize::from(x));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The X.509 version of a DER certificate (1, 2 or 3): the version field, explicit tag [0]
/// first in the to-be-signed part, is left out of a v1 certificate.
fn x509_version(der: &[u8]) -> Option<u8> {
    let (0x30, cert, _) = tlv(der)? else {
        return None;
    };
    let (0x30, tbs, _) = tlv(cert)? else {
        return None;
    };
    let (tag, version, _) = tlv(tbs)?;
    if tag != 0xa0 {
        return Some(1);
    }
    let (0x02, v, _) = tlv(version)? else {
        return None;
    };
    v.last()?.checked_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate's outline: SEQUENCE { SEQUENCE tbs { [version], serial }, ... }.
    fn der(version: Option<u8>) -> Vec<u8> {
        let mut tbs = Vec::new();
        if let Some(v) = version {
            tbs.extend([0xa0, 3, 0x02, 1, v]);
        }
        tbs.extend([0x02, 1, 7]);
        let mut inner = vec![0x30, tbs.len() as u8];
        inner.extend(tbs);
        let mut out = vec![0x30, 0x81, inner.len() as u8];
        out.extend(inner);
        out
    }

    #[test]
    fn the_x509_version_is_read_from_the_der() {
        assert_eq!(x509_version(&der(None)), Some(1));
        assert_eq!(x509_version(&der(Some(1))), Some(2));
        assert_eq!(x509_version(&der(Some(2))), Some(3));
        assert_eq!(x509_version(&[0x30, 5, 1]), None);
        assert_eq!(x509_version(&[]), None);
    }

    #[test]
    fn plain_http_beside_tls_is_refused() {
        let none = Tls {
            cacert: None,
            cert: None,
            key: None,
        };
        let e = check(&none, &["http://a:1".into(), "https://b:1".into()]).unwrap_err();
        assert_eq!(crate::exit::exit_of(&e), Exit::Usage);
        assert!(
            e.to_string().contains("another endpoint is https://"),
            "{e}"
        );
        let ca = Tls {
            cacert: Some("/nonexistent".into()),
            ..none
        };
        let e = check(&ca, &["http://a:1".into()]).unwrap_err();
        assert!(
            e.to_string().contains("--cacert and --cert are for TLS"),
            "{e}"
        );
        let e = check(&ca, &["a:1".into()]).unwrap_err();
        assert!(e.to_string().starts_with("--cacert /nonexistent: "), "{e}");
    }
}
