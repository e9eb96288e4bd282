//! The server emulator's control channel: newline-delimited JSON over `unix:PATH` or
//! `tcp:HOST:PORT`, authenticated by a shared token, the same framing as the network
//! emulator's. The first request must be `{"op":"hello","token":...}`; then `stats`,
//! `reset_stats` and `shutdown`, each answered by `{"ok":true,"result":...}` or
//! `{"ok":false,"error":...}`.

use std::io::{self, BufRead, BufReader, Write};
use std::time::Duration;

use mimic_netemu::control::ControlAddr;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::server::{ServerStats, Stats};

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Hello { token: String },
    Stats,
    ResetStats,
    Shutdown,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("server control channel {addr}: {err}")]
    Io { addr: String, err: io::Error },
    #[error("server control channel: refused: {0}")]
    Refused(String),
    #[error("server control channel: bad response: {0}")]
    Protocol(String),
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves the control channel until `stop` turns true (a `shutdown` request turns it).
pub async fn serve(
    addr: ControlAddr,
    token: String,
    stats: Stats,
    stop_tx: watch::Sender<bool>,
) -> io::Result<()> {
    let mut stop = stop_tx.subscribe();
    match addr {
        ControlAddr::Unix(p) => {
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d)?;
            }
            let _ = std::fs::remove_file(&p);
            let l = tokio::net::UnixListener::bind(&p)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
            loop {
                tokio::select! {
                    r = l.accept() => if let Ok((s, _)) = r {
                        let (r, w) = s.into_split();
                        tokio::spawn(connection(r, w, token.clone(), stats.clone(), stop_tx.clone()));
                    },
                    _ = stop.changed() => if *stop.borrow() { break },
                }
            }
            let _ = std::fs::remove_file(&p);
        }
        ControlAddr::Tcp(a) => {
            let l = tokio::net::TcpListener::bind(&a)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("{a}: {e}")))?;
            loop {
                tokio::select! {
                    r = l.accept() => if let Ok((s, _)) = r {
                        let _ = s.set_nodelay(true);
                        let (r, w) = s.into_split();
                        tokio::spawn(connection(r, w, token.clone(), stats.clone(), stop_tx.clone()));
                    },
                    _ = stop.changed() => if *stop.borrow() { break },
                }
            }
        }
    }
    Ok(())
}

async fn connection<R, W>(r: R, mut w: W, token: String, stats: Stats, stop: watch::Sender<bool>)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut lines = tokio::io::BufReader::new(r).lines();
    let mut authed = false;
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(3600), lines.next_line()).await
    {
        if line.len() > 1 << 16 {
            break;
        }
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(Request::Hello { token: t }) => {
                authed = ct_eq(t.as_bytes(), token.as_bytes());
                if authed {
                    json!({"ok": true, "result": {"server": "mimic serve", "version": env!("CARGO_PKG_VERSION")}})
                } else {
                    json!({"ok": false, "error": "wrong token"})
                }
            }
            Ok(_) if !authed => json!({"ok": false, "error": "say hello with the token first"}),
            Ok(Request::Stats) => json!({"ok": true, "result": stats.snapshot()}),
            Ok(Request::ResetStats) => {
                stats.reset();
                json!({"ok": true, "result": null})
            }
            Ok(Request::Shutdown) => {
                let _ = stop.send(true);
                json!({"ok": true, "result": null})
            }
            Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
        };
        let mut out = reply.to_string();
        out.push('\n');
        if w.write_all(out.as_bytes()).await.is_err() || !authed {
            break;
        }
    }
}

enum Stream {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

impl io::Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl io::Write for Stream {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A blocking client of a running server emulator.
pub struct ServeClient {
    addr: String,
    r: BufReader<Stream>,
    w: Stream,
}

impl ServeClient {
    pub fn connect(addr: &ControlAddr, token: &str) -> Result<ServeClient, ControlError> {
        let name = addr.to_string();
        let ioe = |err: io::Error| ControlError::Io {
            addr: name.clone(),
            err,
        };
        let (r, w) = match addr {
            ControlAddr::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p).map_err(ioe)?;
                (Stream::Unix(s.try_clone().map_err(ioe)?), Stream::Unix(s))
            }
            ControlAddr::Tcp(a) => {
                let s = std::net::TcpStream::connect(a).map_err(ioe)?;
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s.try_clone().map_err(ioe)?), Stream::Tcp(s))
            }
        };
        let mut c = ServeClient {
            addr: name,
            r: BufReader::new(r),
            w,
        };
        c.call(&Request::Hello {
            token: token.into(),
        })?;
        Ok(c)
    }

    fn call(&mut self, req: &Request) -> Result<Value, ControlError> {
        let addr = self.addr.clone();
        let ioe = |err: io::Error| ControlError::Io {
            addr: addr.clone(),
            err,
        };
        let mut line =
            serde_json::to_string(req).map_err(|e| ControlError::Protocol(e.to_string()))?;
        line.push('\n');
        self.w.write_all(line.as_bytes()).map_err(ioe)?;
        let mut resp = String::new();
        if self.r.read_line(&mut resp).map_err(ioe)? == 0 {
            return Err(ControlError::Refused(
                "the server closed the control connection".into(),
            ));
        }
        let v: Value = serde_json::from_str(&resp)
            .map_err(|e| ControlError::Protocol(format!("{e}: {resp}")))?;
        if v["ok"] == Value::Bool(true) {
            Ok(v["result"].clone())
        } else {
            Err(ControlError::Refused(
                v["error"].as_str().unwrap_or("unknown error").to_string(),
            ))
        }
    }

    pub fn stats(&mut self) -> Result<ServerStats, ControlError> {
        serde_json::from_value(self.call(&Request::Stats)?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    pub fn reset_stats(&mut self) -> Result<(), ControlError> {
        self.call(&Request::ResetStats).map(|_| ())
    }

    pub fn shutdown(&mut self) -> Result<(), ControlError> {
        self.call(&Request::Shutdown).map(|_| ())
    }
}
