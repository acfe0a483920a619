//! Certificates for mutual TLS, made with openssl: a CA, and certificates it signs for
//! 127.0.0.1 (server and client use alike). The security tests and the bench's `--tls` use them.

use std::path::Path;
use std::process::Command;

/// A new P-256 key, unencrypted, written to the path that follows.
const NEW_KEY: [&str; 6] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
];

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a certificate signed by it for `name` with the given SAN.
pub fn ca(dir: &Path, ca: &str) {
    let (key, crt, subj) = (
        format!("{ca}.key"),
        format!("{ca}.crt"),
        format!("/CN={ca}"),
    );
    let mut args = vec!["req", "-x509"];
    args.extend(NEW_KEY);
    args.extend([
        key.as_str(),
        "-out",
        &crt,
        "-days",
        "2",
        "-subj",
        &subj,
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &args);
}

pub fn cert(dir: &Path, ca: &str, name: &str, cn: &str) {
    cert_as(dir, ca, name, cn, true);
}

/// A certificate signed by `ca`: v3 with its extensions copied from the request, or, with
/// `v3` false, as `openssl x509 -req` makes it without extensions (X.509 v1).
pub fn cert_as(dir: &Path, ca: &str, name: &str, cn: &str, v3: bool) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    let subj = format!("/CN={cn}");
    let mut req = vec!["req", "-new"];
    req.extend(NEW_KEY);
    req.extend([key.as_str(), "-out", &csr, "-subj", &subj]);
    if v3 {
        req.extend([
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-addext",
            "extendedKeyUsage=serverAuth,clientAuth",
            "-addext",
            "basicConstraints=CA:FALSE",
        ]);
    }
    openssl(dir, &req);
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    let mut sign = vec![
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        "2",
    ];
    if v3 {
        sign.extend(["-copy_extensions", "copy"]);
    }
    openssl(dir, &sign);
}

/// etcd's flags for mutual TLS with `server.crt`, `server.key` and `ca.crt` from `dir`.
pub fn server_args(dir: &Path) -> Vec<String> {
    let p = |f: &str| dir.join(f).display().to_string();
    vec![
        "--cert-file".into(),
        p("server.crt"),
        "--key-file".into(),
        p("server.key"),
        "--trusted-ca-file".into(),
        p("ca.crt"),
        "--client-cert-auth".into(),
    ]
}
