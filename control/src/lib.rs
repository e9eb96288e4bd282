//! The control channel of every mimic role, and the PKI behind it.
//!
//! A role (`mimic netemu run`, `mimic serve`, later agents) listens on `unix:PATH` or
//! `tcp:HOST:PORT` with a [`Server`]; the replay controller reaches it with a [`Client`]. Every
//! connection is TLS 1.3 (rustls) with mutual certificate authentication: the role presents
//! the certificate `mimic pki init` made for it (extended key usage serverAuth, DNS name = the
//! role's name), the controller presents the controller's (clientAuth), and each side accepts
//! only certificates signed by the CA of the same `pki init`. No secret ever crosses the wire;
//! a peer without a valid certificate is refused during the handshake, before any command is
//! read. Inside the TLS stream the commands are newline-delimited JSON, as before: a request
//! `{"op":"...", ...}` gets one response line, `{"ok":true,"result":...}` or
//! `{"ok":false,"error":"..."}`. The server answers `hello` itself (the role's name and
//! version); every other op goes to the role's handler.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

mod client;
pub mod pki;
mod server;

pub use client::Client;
pub use pki::{ControllerTls, PkiError, RoleTls};
pub use server::{Handler, Listener, Server, ServerCounters};

/// Where a control channel listens: `unix:/run/mimic/lab/netemu.sock` or `tcp:127.0.0.1:7070`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl FromStr for ControlAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: needs a path".into());
            }
            Ok(ControlAddr::Unix(p.into()))
        } else if let Some(a) = s.strip_prefix("tcp:") {
            if !a.contains(':') {
                return Err(format!("`{s}`: write tcp:HOST:PORT"));
            }
            Ok(ControlAddr::Tcp(a.into()))
        } else {
            Err(format!(
                "`{s}` is not a control address (unix:PATH or tcp:HOST:PORT)"
            ))
        }
    }
}

impl fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ControlAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The peer could not be reached or the connection broke.
    #[error("control channel {addr}: {err}")]
    Io { addr: String, err: io::Error },
    /// The TLS handshake failed: one side's certificate is not from this PKI, is missing, or
    /// the peer does not speak TLS. Retrying does not help.
    #[error("control channel {addr}: not authenticated: {why}")]
    Auth { addr: String, why: String },
    /// The role refused the command.
    #[error("control channel: the {role} refused: {msg}")]
    Refused { role: String, msg: String },
    #[error("control channel: bad response: {0}")]
    Protocol(String),
    #[error(transparent)]
    Pki(#[from] PkiError),
}

impl ControlError {
    /// Whether retrying cannot help (a refused handshake or command), as opposed to a role
    /// that is not listening yet.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ControlError::Auth { .. } | ControlError::Refused { .. } | ControlError::Pki(_)
        )
    }
}

/// The transport under TLS.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
    pub(crate) fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(nb),
            Stream::Tcp(s) => s.set_nonblocking(nb),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// The rustls error inside an I/O error, if any.
pub(crate) fn tls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>())
}

/// A sentence for an operator: why a handshake failed.
pub(crate) fn explain(e: &rustls::Error) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidMessage(_) | E::InappropriateHandshakeMessage { .. } => {
            "the peer does not speak TLS 1.3 (a plaintext client, or a mimic from before the control channel was encrypted?)".into()
        }
        E::NoCertificatesPresented => {
            "the peer presented no certificate (give it the controller's certificate and key from `mimic pki init`)".into()
        }
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "the peer's certificate is not signed by this PKI's CA (made by another `mimic pki init`?)".into()
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the peer's certificate is for another role".into()
        }
        E::InvalidCertificate(C::InvalidPurpose | C::InvalidPurposeContext { .. }) => {
            "the peer's certificate is not meant for this side of the channel (a role's certificate used as the controller's, or the reverse)".into()
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the peer's certificate has expired (run `mimic pki init --force` and distribute the new files)".into()
        }
        E::InvalidCertificate(c) => format!("the peer's certificate is not valid: {c:?}"),
        E::AlertReceived(A::CertificateRequired) => {
            "the peer wants a certificate and we have none".into()
        }
        E::AlertReceived(A::UnknownCA | A::BadCertificate | A::DecryptError) => {
            "the peer refused our certificate (not signed by its CA: are both sides' files from the same `mimic pki init`?)".into()
        }
        E::AlertReceived(A::UnsupportedCertificate) => {
            "the peer refused our certificate as not meant for this side of the channel".into()
        }
        E::AlertReceived(a) => format!("the peer ended the handshake: {a:?}"),
        E::PeerIncompatible(p) => format!("the peer's TLS is incompatible: {p:?}"),
        other => other.to_string(),
    }
}

/// Waits between connection attempts and for handshakes.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;
