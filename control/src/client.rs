//! The controller's side: a blocking client that authenticates the role (and itself) and then
//! sends request lines.

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use serde::Serialize;
use serde_json::Value;

use crate::{
    explain, tls_error, ControlAddr, ControlError, ControllerTls, Stream, HANDSHAKE_TIMEOUT,
};

/// A blocking, authenticated connection to one role.
pub struct Client {
    addr: String,
    role: String,
    r: BufReader<StreamOwned<ClientConnection, Stream>>,
}

impl Client {
    /// Connects to the role `role` (`netemu`, `serve`, …) at `addr`: the TLS handshake
    /// checks that the peer holds that role's certificate from our CA and shows it ours; a
    /// `hello` round trip then confirms the role accepted it. A refusal on either side is a
    /// [`ControlError::Auth`] with the reason.
    pub fn connect(
        addr: &ControlAddr,
        tls: &ControllerTls,
        role: &str,
    ) -> Result<Client, ControlError> {
        let name = addr.to_string();
        let ioe = |err: io::Error| ControlError::Io {
            addr: name.clone(),
            err,
        };
        let mut s = match addr {
            ControlAddr::Unix(p) => Stream::Unix(UnixStream::connect(p).map_err(ioe)?),
            ControlAddr::Tcp(a) => {
                let t = TcpStream::connect(a).map_err(ioe)?;
                let _ = t.set_nodelay(true);
                Stream::Tcp(t)
            }
        };
        let server_name = ServerName::try_from(role.to_string())
            .map_err(|_| ControlError::Protocol(format!("`{role}` is not a role name")))?;
        let mut conn =
            ClientConnection::new(tls.config(), server_name).map_err(|e| ControlError::Auth {
                addr: name.clone(),
                why: e.to_string(),
            })?;
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .map_err(ioe)?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        while conn.is_handshaking() {
            if Instant::now() > deadline {
                return Err(ControlError::Auth {
                    addr: name,
                    why: format!(
                        "the peer did not finish a TLS handshake within {} s (is it a mimic role with the control channel?)",
                        HANDSHAKE_TIMEOUT.as_secs()
                    ),
                });
            }
            match conn.complete_io(&mut s) {
                Ok((0, 0)) if conn.is_handshaking() => {
                    return Err(ControlError::Auth {
                        addr: name,
                        why: "the peer closed the connection during the handshake".into(),
                    })
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(handshake_error(&name, e)),
            }
        }
        // the role answers in its own time (the emulator's datapath may take seconds)
        s.set_read_timeout(None).map_err(ioe)?;
        let mut c = Client {
            addr: name,
            role: role.to_string(),
            r: BufReader::new(StreamOwned::new(conn, s)),
        };
        // In TLS 1.3 the role checks our certificate after our side considers the handshake
        // done: its verdict arrives with the first answer.
        let hello = c
            .call_raw(&serde_json::json!({"op": "hello"}))
            .map_err(|e| match e {
                ControlError::Io { addr, err } => handshake_error(&addr, err),
                e => e,
            })?;
        if hello.get("role").and_then(Value::as_str) != Some(role) {
            return Err(ControlError::Protocol(format!(
                "{}: expected the {role}, the peer says it is {hello}",
                c.addr
            )));
        }
        Ok(c)
    }

    /// The address this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one request (a serializable `{"op": ...}` object) and returns its `result`.
    pub fn call<T: Serialize>(&mut self, req: &T) -> Result<Value, ControlError> {
        let v = serde_json::to_value(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        self.call_raw(&v)
    }

    fn call_raw(&mut self, req: &Value) -> Result<Value, ControlError> {
        let mut line =
            serde_json::to_vec(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let addr = self.addr.clone();
        let ioe = |err: io::Error| ControlError::Io {
            addr: addr.clone(),
            err,
        };
        let w = self.r.get_mut();
        w.write_all(&line).map_err(ioe)?;
        w.flush().map_err(ioe)?;
        let mut resp = String::new();
        let n = self.r.read_line(&mut resp).map_err(ioe)?;
        if n == 0 {
            return Err(ControlError::Io {
                addr: self.addr.clone(),
                err: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the {} closed the connection", self.role),
                ),
            });
        }
        let v: Value = serde_json::from_str(&resp)
            .map_err(|e| ControlError::Protocol(format!("{e}: {resp}")))?;
        if v.get("ok") == Some(&Value::Bool(true)) {
            Ok(v.get("result").cloned().unwrap_or(Value::Null))
        } else {
            Err(ControlError::Refused {
                role: self.role.clone(),
                msg: v
                    .get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or("unknown error")
                    .to_string(),
            })
        }
    }
}

fn handshake_error(addr: &str, e: io::Error) -> ControlError {
    match tls_error(&e) {
        Some(t) => ControlError::Auth {
            addr: addr.to_string(),
            why: explain(t),
        },
        None if matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::UnexpectedEof
                | io::ErrorKind::BrokenPipe
        ) =>
        {
            ControlError::Auth {
                addr: addr.to_string(),
                why: format!("the peer ended the handshake ({e}): it refused our certificate, or it does not speak TLS"),
            }
        }
        None => ControlError::Io {
            addr: addr.to_string(),
            err: e,
        },
    }
}
