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
    explain, tls_error, ControlAddr, ControlError, ControllerTls, Stream, CALL_TIMEOUT,
    HANDSHAKE_TIMEOUT,
};

/// How often a call waiting for its answer wakes to look at its deadline.
const READ_SLICE: Duration = Duration::from_millis(250);

/// A blocking, authenticated connection to one role. Every call waits for its answer at most
/// its time limit ([`CALL_TIMEOUT`] unless set otherwise); on TCP a peer whose host went away
/// is noticed within about 30 s. A call that timed out or broke on I/O leaves the client
/// unusable: later calls fail at once, saying why (connect again).
pub struct Client {
    addr: String,
    role: String,
    r: BufReader<StreamOwned<ClientConnection, Stream>>,
    call_timeout: Duration,
    /// Why the connection can no longer be used, once a call broke it.
    broken: Option<String>,
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
        s.watch_peer().map_err(ioe)?;
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
        // a call waits for its answer in slices, looking at its own deadline in between
        s.set_read_timeout(Some(READ_SLICE)).map_err(ioe)?;
        let mut c = Client {
            addr: name,
            role: role.to_string(),
            r: BufReader::new(StreamOwned::new(conn, s)),
            call_timeout: CALL_TIMEOUT,
            broken: None,
        };
        // In TLS 1.3 the role checks our certificate after our side considers the handshake
        // done: its verdict arrives with the first answer.
        let hello = c
            .call_raw(&serde_json::json!({"op": "hello"}), HANDSHAKE_TIMEOUT)
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

    #[cfg(test)]
    pub(crate) fn stream(&self) -> &Stream {
        &self.r.get_ref().sock
    }

    /// The address this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The time limit of every later [`Client::call`] (at first [`CALL_TIMEOUT`]).
    pub fn set_call_timeout(&mut self, t: Duration) {
        self.call_timeout = t;
    }

    /// Sends one request (a serializable `{"op": ...}` object) and returns its `result`,
    /// waiting for it at most the client's time limit.
    pub fn call<T: Serialize>(&mut self, req: &T) -> Result<Value, ControlError> {
        self.call_within(req, self.call_timeout)
    }

    /// [`Client::call`] with a time limit of its own, for a request known to be quick (a
    /// status poll) or slow.
    pub fn call_within<T: Serialize>(
        &mut self,
        req: &T,
        limit: Duration,
    ) -> Result<Value, ControlError> {
        let v = serde_json::to_value(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        self.call_raw(&v, limit)
    }

    fn call_raw(&mut self, req: &Value, limit: Duration) -> Result<Value, ControlError> {
        if let Some(why) = &self.broken {
            return Err(ControlError::Io {
                addr: self.addr.clone(),
                err: io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("the connection is closed: {why}; connect again"),
                ),
            });
        }
        let op = req
            .get("op")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        let mut line =
            serde_json::to_vec(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let deadline = Instant::now() + limit;
        let sent = {
            let w = self.r.get_mut();
            // a peer that reads nothing blocks the write at most the call's limit
            w.sock
                .set_write_timeout(Some(limit.max(Duration::from_millis(1))))
                .and_then(|()| w.write_all(&line))
                .and_then(|()| w.flush())
        };
        if let Err(err) = sent {
            // a record may be half written: nothing after it would make sense to the role
            return Err(self.close(format!("`{op}` could not be sent ({err})"), err));
        }
        let mut resp = Vec::new();
        loop {
            match self.r.read_until(b'\n', &mut resp) {
                Ok(_) if resp.last() == Some(&b'\n') => break,
                Ok(_) => {
                    let err = io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the {} closed the connection", self.role),
                    );
                    return Err(self.close(format!("the {} closed it", self.role), err));
                }
                // a read slice ran out (SO_RCVTIMEO gives EAGAIN; ETIMEDOUT is the kernel
                // giving up on the peer, below)
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    if Instant::now() >= deadline {
                        let secs = limit.as_secs_f64().ceil() as u64;
                        // the request itself still unacknowledged: the host, not the role
                        if let Some(n) = self.r.get_ref().sock.unacked_retransmits() {
                            return Err(self.host_gone(
                                &op,
                                io::ErrorKind::TimedOut,
                                format!("(nothing acknowledged in the {secs} s since it was sent, {n} retransmissions: down or cut off?)"),
                            ));
                        }
                        self.close(format!("`{op}` timed out after {secs} s"), e);
                        return Err(ControlError::Timeout {
                            addr: self.addr.clone(),
                            role: self.role.clone(),
                            op,
                            secs,
                        });
                    }
                }
                // the kernel gave up on the peer (PEER_SILENT without an acknowledgement; the
                // neighbour's address no longer resolving on a LAN gives "no route to host")
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::TimedOut
                            | io::ErrorKind::HostUnreachable
                            | io::ErrorKind::NetworkUnreachable
                    ) =>
                {
                    return Err(self.host_gone(
                        &op,
                        err.kind(),
                        format!(
                            "(nothing acknowledged for {} s: down or cut off?): {err}",
                            crate::PEER_SILENT.as_secs()
                        ),
                    ));
                }
                Err(err) => return Err(self.close(format!("`{op}` failed ({err})"), err)),
            }
        }
        let v: Value = serde_json::from_slice(&resp).map_err(|e| {
            ControlError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&resp)))
        })?;
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

    /// The call `op` met a host that went away (`how`: what showed it): the connection is
    /// closed and the error names the role's host, not the role.
    fn host_gone(&mut self, op: &str, kind: io::ErrorKind, how: String) -> ControlError {
        let err = io::Error::new(
            kind,
            format!(
                "the {}'s host stopped answering during `{op}` {how}",
                self.role
            ),
        );
        self.close(format!("`{op}` found the peer gone"), err)
    }

    /// Marks the connection unusable (`why`, for later calls), shuts it down so that the role
    /// sees it end, and returns `err` as this call's error.
    fn close(&mut self, why: String, err: io::Error) -> ControlError {
        self.broken = Some(why);
        self.r.get_ref().sock.shutdown();
        ControlError::Io {
            addr: self.addr.clone(),
            err,
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
