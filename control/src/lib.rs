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
//!
//! Nothing waits for ever: a call has a time limit ([`CALL_TIMEOUT`] unless the caller sets
//! one) and fails with [`ControlError::Timeout`]; on TCP both sides have the kernel watch the
//! peer (keepalive, `TCP_USER_TIMEOUT`), so a host that went away is noticed within ~30 s.

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
            // the port after the last colon (an IPv6 host in brackets: tcp:[::1]:7000)
            let port_ok = a.rsplit_once(':').is_some_and(|(host, port)| {
                !host.is_empty()
                    && port.parse::<u16>().is_ok()
                    && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')))
            });
            if !port_ok {
                return Err(format!(
                    "`{s}`: write tcp:HOST:PORT (an IPv6 address in brackets: tcp:[::1]:7000)"
                ));
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
    /// The role did not answer a request within the call's time limit ([`CALL_TIMEOUT`]
    /// unless the caller set another). The connection is closed: the answer, if it ever
    /// comes, cannot be told from the next one's.
    #[error("control channel {addr}: the {role} did not answer `{op}` within {secs} s (busy or hung; the connection is closed)")]
    Timeout {
        addr: String,
        role: String,
        op: String,
        secs: u64,
    },
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
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
    /// On TCP, has the kernel notice a peer whose host went away (powered off, cut off by a
    /// partition; a peer *process* that dies closes the connection itself): keepalive probes
    /// after [`PEER_IDLE`] without traffic, and [`PEER_SILENT`] at most without an answer to
    /// them or an acknowledgement of data sent (`TCP_USER_TIMEOUT`). The blocked read or write
    /// then fails, where it would otherwise wait for ever on an idle connection and about 15
    /// minutes (the kernel's retransmissions) on a busy one. A unix socket needs none of this.
    pub(crate) fn watch_peer(&self) -> io::Result<()> {
        let Stream::Tcp(s) = self else { return Ok(()) };
        let sock = socket2::SockRef::from(s);
        sock.set_tcp_keepalive(
            &socket2::TcpKeepalive::new()
                .with_time(PEER_IDLE)
                .with_interval(PEER_PROBE_INTERVAL)
                .with_retries(PEER_PROBES),
        )?;
        sock.set_tcp_user_timeout(Some(PEER_SILENT))
    }
    /// On TCP, how many times in a row the kernel has retransmitted data the peer has not
    /// acknowledged (`tcpi_retransmits` of `TCP_INFO`), when it has: a call that timed out
    /// with its request still unacknowledged met a host that went away, not a busy role
    /// (whose kernel acknowledges the request all the same). `None` on a unix socket, with
    /// nothing outstanding, or when the kernel does not say.
    pub(crate) fn unacked_retransmits(&self) -> Option<u8> {
        use std::os::fd::AsRawFd;
        let Stream::Tcp(s) = self else { return None };
        // SAFETY: tcp_info is plain old data; getsockopt writes at most `len` bytes into it
        // and says how many it wrote.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        (rc == 0 && info.tcpi_unacked > 0 && info.tcpi_retransmits > 0)
            .then_some(info.tcpi_retransmits)
    }
    #[cfg(test)]
    pub(crate) fn tcp_user_timeout(&self) -> Option<Duration> {
        match self {
            Stream::Tcp(s) => socket2::SockRef::from(s).tcp_user_timeout().ok().flatten(),
            Stream::Unix(_) => None,
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

/// How long a call waits for the role's answer unless the caller sets another
/// ([`Client::set_call_timeout`], [`Client::call_within`]), and how long a role waits to hand
/// an answer to a controller that does not read it. The longest request mimic makes is an
/// `install_pipes` of 2,000 connections in a router guest under TCG (about 25 s at the 11-13 ms
/// a connection measured there, bench/RESULTS.md); a role that takes ten minutes is hung.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// A TCP control connection without traffic this long gets keepalive probes...
const PEER_IDLE: Duration = Duration::from_secs(10);
/// ... this often ...
const PEER_PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// ... this many before the kernel calls the peer gone ...
const PEER_PROBES: u32 = 4;
/// ... and it calls the peer gone whenever its probes or data sent went unanswered this long
/// (`TCP_USER_TIMEOUT`, which takes over from the probe count once set).
pub(crate) const PEER_SILENT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;
