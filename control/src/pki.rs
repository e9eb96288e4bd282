//! The control channel's PKI: `mimic pki init DIR` makes a CA and signs one certificate for
//! the controller and one per role; the roles and the controller load theirs from a
//! directory.
//!
//! Layout of DIR (PEM files):
//! * `ca.crt` — the CA certificate: every host gets it.
//! * `controller.crt`, `controller.key` — the replay controller's identity (extended key
//!   usage clientAuth): only the controller host gets them.
//! * `ROLE.crt`, `ROLE.key` for each role (`netemu`, `serve`, `agent`, and any `--role NAME`): the
//!   certificate names the role (DNS name `ROLE`, extended key usage serverAuth), so a
//!   controller that dials the emulator cannot be answered by the server's key, and a role's
//!   key cannot give commands.
//!
//! The CA's private key is used once to sign and never written: nobody can issue a further
//! certificate from a copy of DIR. Adding a host later means a new `pki init --force` and
//! distributing the new files.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The roles `pki init` always makes certificates for.
pub const ROLES: [&str; 3] = ["netemu", "serve", "agent"];
/// The file stem of the controller's certificate and key.
pub const CONTROLLER: &str = "controller";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {why}")]
    File { path: PathBuf, why: String },
    #[error("{0}")]
    Invalid(String),
}

fn file_err(path: &Path, why: impl ToString) -> PkiError {
    PkiError::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Options of `pki init`.
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Replace files that exist.
    pub force: bool,
    /// Roles beyond [`ROLES`].
    pub extra_roles: Vec<String>,
    /// Validity of every certificate, in days from now.
    pub days: u32,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            force: false,
            extra_roles: Vec::new(),
            days: 825,
        }
    }
}

/// A role name: what a certificate names and a controller asks for (a DNS label).
pub fn validate_role(name: &str) -> Result<(), PkiError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !ok {
        return Err(PkiError::Invalid(if name.len() > 63 {
            format!(
                "a role name holds at most 63 characters (a DNS label), this one has {}",
                name.len()
            )
        } else {
            format!(
                "`{name}` is not a role name (lower-case letters, digits and `-`, starting with a letter, not ending with `-`)"
            )
        }));
    }
    if name == CONTROLLER || name == "ca" {
        return Err(PkiError::Invalid(format!(
            "`{name}` is reserved (it names a file `pki init` writes anyway)"
        )));
    }
    Ok(())
}

/// Writes a new PKI into `dir` (created mode 0700 if missing); returns the files written.
/// Refuses, before writing anything, when one of them exists and `force` is off.
pub fn init(dir: &Path, opts: &InitOptions) -> Result<Vec<PathBuf>, PkiError> {
    init_at(dir, opts, time::OffsetDateTime::now_utc())
}

/// [`init`] as if the clock read `now` (a PKI made in the past, for tests of expiry).
pub(crate) fn init_at(
    dir: &Path,
    opts: &InitOptions,
    now: time::OffsetDateTime,
) -> Result<Vec<PathBuf>, PkiError> {
    let mut roles: Vec<String> = ROLES.iter().map(|r| r.to_string()).collect();
    for r in &opts.extra_roles {
        validate_role(r)?;
        if !roles.contains(r) {
            roles.push(r.clone());
        }
    }
    if opts.days == 0 {
        return Err(PkiError::Invalid("--days must be at least 1".into()));
    }
    // a little slack for hosts whose clocks run behind the one that made the PKI
    let not_before = now - time::Duration::hours(1);
    // X.509 writes times up to the year 9999 (GeneralizedTime)
    let not_after = now
        .checked_add(time::Duration::days(opts.days.into()))
        .filter(|t| t.year() <= 9999)
        .ok_or_else(|| {
            PkiError::Invalid(format!(
                "--days {}: the certificates would expire after the year 9999, the last an X.509 certificate can name (at most {} days from today)",
                opts.days,
                (time::Date::from_calendar_date(9999, time::Month::December, 31)
                    .expect("a valid date")
                    - now.date())
                .whole_days()
            ))
        })?;
    let mut stems = vec![CONTROLLER.to_string()];
    stems.extend(roles.iter().cloned());
    let mut files = vec![dir.join("ca.crt")];
    for s in &stems {
        files.push(dir.join(format!("{s}.crt")));
        files.push(dir.join(format!("{s}.key")));
    }
    if !opts.force {
        let present: Vec<String> = files
            .iter()
            .filter(|f| f.exists())
            .map(|f| f.display().to_string())
            .collect();
        if !present.is_empty() {
            return Err(PkiError::Invalid(format!(
                "{} already holds a PKI ({}); give --force to replace it (every host then needs the new files)",
                dir.display(),
                present.join(", ")
            )));
        }
    }
    // a path that is there but is no file (a directory, say) would fail its rename halfway
    // through and leave old and new files mixed: refused before anything is written
    for f in &files {
        if let Ok(m) = std::fs::symlink_metadata(f) {
            if !m.file_type().is_file() {
                return Err(file_err(
                    f,
                    "is there but is not a regular file; nothing was written",
                ));
            }
        }
    }
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| file_err(dir, e))?;
    }

    let gen = |e: rcgen::Error| PkiError::Invalid(format!("making a certificate: {e}"));

    let ca_key = KeyPair::generate().map_err(gen)?;
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "mimic");
    dn.push(DnType::CommonName, "mimic control CA");
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(gen)?;
    let issuer = Issuer::new(ca, ca_key);

    let mut out: Vec<(PathBuf, String, u32)> = vec![(dir.join("ca.crt"), ca_cert.pem(), 0o644)];
    for stem in &stems {
        let key = KeyPair::generate().map_err(gen)?;
        let mut p = CertificateParams::new(vec![stem.clone()]).map_err(gen)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "mimic");
        dn.push(DnType::CommonName, format!("mimic {stem}"));
        p.distinguished_name = dn;
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![if stem == CONTROLLER {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        p.use_authority_key_identifier_extension = true;
        p.not_before = not_before;
        p.not_after = not_after;
        let cert = p.signed_by(&key, &issuer).map_err(gen)?;
        out.push((dir.join(format!("{stem}.crt")), cert.pem(), 0o644));
        out.push((dir.join(format!("{stem}.key")), key.serialize_pem(), 0o600));
    }
    // every file written aside first, then all renamed: a failure while writing (a full
    // disk, say) replaces nothing, and the renames are what is left to fail
    let mut written: Vec<(PathBuf, &Path)> = Vec::new();
    for (path, text, mode) in &out {
        match write_aside(path, text.as_bytes(), *mode) {
            Ok(tmp) => written.push((tmp, path)),
            Err(e) => {
                for (tmp, _) in &written {
                    let _ = std::fs::remove_file(tmp);
                }
                return Err(e);
            }
        }
    }
    for (i, (tmp, path)) in written.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp, path) {
            for (t, _) in &written[i..] {
                let _ = std::fs::remove_file(t);
            }
            return Err(file_err(
                path,
                format!(
                    "{e} (the {i} files before it in this list were replaced: {})",
                    written[..i]
                        .iter()
                        .map(|(_, p)| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    Ok(out.into_iter().map(|(p, _, _)| p).collect())
}

/// Writes `data` to a temporary file beside `path` (created with `mode`, synced) and returns
/// its name, for a rename into place, so a reader never sees half a key.
fn write_aside(path: &Path, data: &[u8], mode: u32) -> Result<PathBuf, PkiError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(file_err(path, e));
    }
    Ok(tmp)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn missing_hint(dir: &Path, file: &str) -> String {
    format!(
        "missing (the control channel needs {file} in {}: make the files with `mimic pki init DIR` and copy ca.crt and this host's certificate and key here)",
        dir.display()
    )
}

fn load_certs(dir: &Path, file: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    let path = dir.join(file);
    if dir.exists() && !dir.is_dir() {
        return Err(file_err(
            dir,
            "not a directory (name the directory that holds `mimic pki init`'s files)",
        ));
    }
    if !path.exists() {
        return Err(file_err(&path, missing_hint(dir, file)));
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&path)
        .map_err(|e| file_err(&path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(&path, format!("not a PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(file_err(&path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn load_key(dir: &Path, file: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    let path = dir.join(file);
    let meta = std::fs::metadata(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            file_err(&path, missing_hint(dir, file))
        } else {
            file_err(&path, e)
        }
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(file_err(
            &path,
            format!("a private key readable by others (mode {mode:o}); `chmod 600` it"),
        ));
    }
    PrivateKeyDer::from_pem_file(&path)
        .map_err(|e| file_err(&path, format!("not a PEM private key: {e}")))
}

fn roots(dir: &Path) -> Result<Arc<RootCertStore>, PkiError> {
    let mut roots = RootCertStore::empty();
    let path = dir.join("ca.crt");
    for c in load_certs(dir, "ca.crt")? {
        roots
            .add(c)
            .map_err(|e| file_err(&path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// A time for a message about a certificate's validity: `2026-12-05 07:20:01 UTC`.
fn utc(t: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// `dir/file` fails the check the other end of the channel makes of it.
fn not_trusted(dir: &Path, file: &str, e: rustls::Error) -> PkiError {
    use rustls::CertificateError as C;
    let why = match &e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "not signed by the CA in {} (the files come from different `mimic pki init` runs: copy ca.crt and this host's certificate and key from one)",
            dir.join("ca.crt").display()
        ),
        rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            format!("names another role (the other end would refuse it): {e}")
        }
        rustls::Error::InvalidCertificate(
            c @ (C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. }),
        ) => {
            let at = |t: &UnixTime| {
                i64::try_from(t.as_secs())
                    .ok()
                    .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
                    .map(|t| format!(" on {}", utc(t)))
                    .unwrap_or_default()
            };
            let what = match c {
                C::ExpiredContext { not_after, .. } => format!("expired{}", at(not_after)),
                C::NotValidYetContext { not_before, .. } => {
                    format!("is not valid before{}", at(not_before))
                }
                C::Expired => "expired".into(),
                _ => "is not valid yet".into(),
            };
            format!(
                "the certificate {what} by this host's clock (it reads {}; if that is right, make new files with `mimic pki init --force`)",
                utc(time::OffsetDateTime::now_utc())
            )
        }
        _ => format!("would be refused by the other end of the channel: {e}"),
    };
    file_err(&dir.join(file), why)
}

/// A role's side of the channel: its certificate and key, and the CA that must have signed
/// the controller's certificate.
#[derive(Clone)]
pub struct RoleTls {
    role: String,
    config: Arc<ServerConfig>,
}

impl RoleTls {
    /// Loads `ca.crt`, `ROLE.crt` and `ROLE.key` from `dir`.
    pub fn load(dir: &Path, role: &str) -> Result<RoleTls, PkiError> {
        validate_role(role)?;
        let roots = roots(dir)?;
        let certs = load_certs(dir, &format!("{role}.crt"))?;
        let key = load_key(dir, &format!("{role}.key"))?;
        // what the controller will check at every handshake, checked now: a certificate from
        // another `pki init` (or another role's) would fail only when a replay dials this host
        let own = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|e| PkiError::Invalid(format!("{}: {e}", dir.join("ca.crt").display())))?;
        let name = ServerName::try_from(role.to_string())
            .map_err(|e| PkiError::Invalid(format!("role {role:?}: {e}")))?;
        own.verify_server_cert(&certs[0], &certs[1..], &name, &[], UnixTime::now())
            .map_err(|e| not_trusted(dir, &format!("{role}.crt"), e))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| PkiError::Invalid(format!("{}: {e}", dir.join("ca.crt").display())))?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| PkiError::Invalid(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| {
                PkiError::Invalid(format!(
                    "{} and {}: {e}",
                    dir.join(format!("{role}.crt")).display(),
                    dir.join(format!("{role}.key")).display()
                ))
            })?;
        Ok(RoleTls {
            role: role.to_string(),
            config: Arc::new(config),
        })
    }

    pub fn role(&self) -> &str {
        &self.role
    }

    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }
}

/// The controller's side: its certificate and key, and the CA that must have signed every
/// role's certificate.
#[derive(Clone)]
pub struct ControllerTls {
    config: Arc<ClientConfig>,
}

impl ControllerTls {
    /// Loads `ca.crt`, `controller.crt` and `controller.key` from `dir`.
    pub fn load(dir: &Path) -> Result<ControllerTls, PkiError> {
        Self::build(dir, CONTROLLER, true)
    }

    /// Loads `ca.crt`, `STEM.crt` and `STEM.key` from `dir`: a controller that shows that
    /// certificate (roles refuse any but the controller's; for tests of the refusal).
    pub fn load_identity(dir: &Path, stem: &str) -> Result<ControllerTls, PkiError> {
        Self::build(dir, stem, false)
    }

    /// The controller of `dir`'s `STEM.crt` and `STEM.key`; with `check`, the certificate
    /// must pass what the roles check of it at every handshake, so that one from another
    /// `pki init` is named before anything starts.
    fn build(dir: &Path, stem: &str, check: bool) -> Result<ControllerTls, PkiError> {
        let roots = roots(dir)?;
        let certs = load_certs(dir, &format!("{stem}.crt"))?;
        let key = load_key(dir, &format!("{stem}.key"))?;
        if check {
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| PkiError::Invalid(format!("{}: {e}", dir.join("ca.crt").display())))?
                .verify_client_cert(&certs[0], &certs[1..], UnixTime::now())
                .map_err(|e| not_trusted(dir, &format!("{stem}.crt"), e))?;
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| PkiError::Invalid(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| {
                PkiError::Invalid(format!(
                    "{} and {}: {e}",
                    dir.join(format!("{stem}.crt")).display(),
                    dir.join(format!("{stem}.key")).display()
                ))
            })?;
        Ok(ControllerTls {
            config: Arc::new(config),
        })
    }

    /// A controller that trusts `dir`'s CA but shows no certificate of its own: what a client
    /// without the key looks like (for tests of the refusal).
    pub fn without_identity(dir: &Path) -> Result<ControllerTls, PkiError> {
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| PkiError::Invalid(e.to_string()))?
            .with_root_certificates(roots(dir)?)
            .with_no_client_auth();
        Ok(ControllerTls {
            config: Arc::new(config),
        })
    }

    pub(crate) fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}
