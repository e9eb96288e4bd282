//! The server emulator's commands on the control channel (`mimic-control`: TLS 1.3 with
//! mutual certificate authentication, newline-delimited JSON, the same channel as the network
//! emulator's): `stats`, `reset_stats`, `allow {ranges}` (the client address ranges the
//! replay port serves; connections from elsewhere are reset and counted), `info {to}` (the
//! server host's kernel and TCP stack, see [`HostInfo`]), the replay's capture at the server
//! host (`capture_start`, `capture_stop`, `capture_read {name, offset, len}`,
//! `capture_discard`; see [`crate::serve_capture`]) and `shutdown`, each answered by
//! `{"ok":true,"result":...}` or `{"ok":false,"error":...}`.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use mimic_control::{ControlAddr, ControlError, ControllerTls, Listener, RoleTls};
use mimic_netemu::classify::IpNet;
use mimic_netemu::stack::{self, StackProfile};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::net::IpAddr;
use tokio::sync::watch;

use crate::serve_capture::{self, CaptureService, CaptureStarted, CaptureStopped, FetchError};
use crate::server::{AllowList, ServerStats, Stats};

/// The server emulator's role name: its certificate is `serve.crt` / `serve.key`.
pub const ROLE: &str = "serve";

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Stats,
    ResetStats,
    Allow {
        ranges: Vec<IpNet>,
    },
    Info {
        #[serde(default)]
        to: Option<IpAddr>,
    },
    CaptureStart,
    CaptureStop,
    CaptureRead {
        name: String,
        offset: u64,
        len: u64,
    },
    CaptureDiscard,
    Shutdown,
}

/// What `mimic serve` reports about the host it runs on (`info`): recorded in the replay
/// database's `meta` in every mode, so that a replay says which kernel and stack answered it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HostInfo {
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The host name (`uname -n`).
    pub hostname: String,
    /// The TCP stack in force in serve's network namespace: the sysctls, and the attributes
    /// (initcwnd, initrwnd, rto_min) of the route towards the address asked about. None when
    /// it could not be read (`stack_error` says why).
    pub stack: Option<StackProfile>,
    pub stack_error: Option<String>,
}

impl HostInfo {
    /// This host, and the route it takes `to` a client.
    pub fn local(to: Option<IpAddr>) -> HostInfo {
        // SAFETY: uname fills the struct it is given; a zeroed utsname is a valid buffer.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::uname(&mut u) } == 0;
        let field = |f: &[libc::c_char]| -> String {
            if !ok {
                return String::new();
            }
            let bytes: Vec<u8> = f
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        // without the route (no `ip` on the host, no route to `to`) the sysctls still count
        let (stack, stack_error) = match stack::read_local(to) {
            Ok(p) => (Some(p), None),
            Err(e) if to.is_some() => match stack::read_local(None) {
                Ok(p) => (Some(p), Some(format!("route attributes not read: {e}"))),
                Err(_) => (None, Some(e.to_string())),
            },
            Err(e) => (None, Some(e.to_string())),
        };
        HostInfo {
            kernel: field(&u.release),
            hostname: field(&u.nodename),
            stack,
            stack_error,
        }
    }
}

/// A running control server of `mimic serve`.
pub struct ControlServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Stops serving and waits for the server's thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Serves the control channel on a thread of its own: a `shutdown` request turns `stop_tx`,
/// an `allow` request replaces `allow`'s ranges, the `capture_*` requests go to `capture`
/// (None: refused, this serve does not capture).
pub fn spawn(
    listener: Listener,
    tls: RoleTls,
    stats: Stats,
    allow: AllowList,
    capture: Option<Arc<CaptureService>>,
    stop_tx: watch::Sender<bool>,
) -> io::Result<ControlServer> {
    let no_capture =
        || "this server emulator does not capture (it runs without a capture service)".to_string();
    let handler: mimic_control::Handler =
        Arc::new(move |v: Value| {
            match serde_json::from_value::<Request>(v).map_err(|e| format!("bad request: {e}"))? {
                Request::Stats => Ok(json!(stats.snapshot())),
                Request::ResetStats => {
                    stats.reset();
                    Ok(Value::Null)
                }
                Request::Allow { ranges } => {
                    tracing::info!(
                        "serving clients from {}",
                        ranges
                            .iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    allow.set(ranges);
                    Ok(Value::Null)
                }
                Request::Info { to } => Ok(json!(HostInfo::local(to))),
                Request::CaptureStart => {
                    let c = capture.as_ref().ok_or_else(no_capture)?;
                    c.start().map(|s| json!(s)).map_err(|e| e.to_string())
                }
                Request::CaptureStop => {
                    let c = capture.as_ref().ok_or_else(no_capture)?;
                    c.stop().map(|s| json!(s)).map_err(|e| e.to_string())
                }
                Request::CaptureRead { name, offset, len } => {
                    let c = capture.as_ref().ok_or_else(no_capture)?;
                    c.read(&name, offset, len)
                        .map(|b| json!({ "data": serve_capture::encode(&b) }))
                        .map_err(|e| e.to_string())
                }
                Request::CaptureDiscard => {
                    if let Some(c) = &capture {
                        c.discard();
                    }
                    Ok(Value::Null)
                }
                Request::Shutdown => {
                    let _ = stop_tx.send(true);
                    Ok(Value::Null)
                }
            }
        });
    let stop = Arc::new(AtomicBool::new(false));
    let thread = mimic_control::Server::new(listener, tls, handler, stop.clone()).spawn()?;
    Ok(ControlServer {
        stop,
        thread: Some(thread),
    })
}

/// A blocking client of a running server emulator.
pub struct ServeClient(mimic_control::Client);

impl ServeClient {
    /// Connects to the server emulator at `addr` and authenticates both sides.
    pub fn connect(addr: &ControlAddr, tls: &ControllerTls) -> Result<ServeClient, ControlError> {
        mimic_control::Client::connect(addr, tls, ROLE).map(ServeClient)
    }

    pub fn stats(&mut self) -> Result<ServerStats, ControlError> {
        serde_json::from_value(self.0.call(&Request::Stats)?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    pub fn reset_stats(&mut self) -> Result<(), ControlError> {
        self.0.call(&Request::ResetStats).map(|_| ())
    }

    /// Announces the client address ranges the replay port is to serve (replacing any
    /// earlier announcement); connections from other addresses are refused.
    pub fn allow(&mut self, ranges: &[IpNet]) -> Result<(), ControlError> {
        self.0
            .call(&Request::Allow {
                ranges: ranges.to_vec(),
            })
            .map(|_| ())
    }

    /// The server host's kernel and TCP stack; `to` (a client address) picks the route
    /// whose attributes are reported.
    pub fn info(&mut self, to: Option<IpAddr>) -> Result<HostInfo, ControlError> {
        serde_json::from_value(self.0.call(&Request::Info { to })?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    pub fn shutdown(&mut self) -> Result<(), ControlError> {
        self.0.call(&Request::Shutdown).map(|_| ())
    }

    /// Starts the replay's capture on the server host; returns once it is capturing.
    pub fn capture_start(&mut self) -> Result<CaptureStarted, ControlError> {
        serde_json::from_value(self.0.call(&Request::CaptureStart)?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    /// Stops the server host's capture: its summary and files.
    pub fn capture_stop(&mut self) -> Result<CaptureStopped, ControlError> {
        serde_json::from_value(self.0.call(&Request::CaptureStop)?)
            .map_err(|e| ControlError::Protocol(e.to_string()))
    }

    /// Up to `len` bytes of the stopped capture's file `name` from `offset`.
    pub fn capture_read(
        &mut self,
        name: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, ControlError> {
        let v = self.0.call(&Request::CaptureRead {
            name: name.to_string(),
            offset,
            len,
        })?;
        let data = v
            .get("data")
            .and_then(Value::as_str)
            .ok_or_else(|| ControlError::Protocol(format!("capture_read: no data in {v}")))?;
        serve_capture::decode(data).map_err(ControlError::Protocol)
    }

    /// Stops the server host's capture if it runs and removes its files.
    pub fn capture_discard(&mut self) -> Result<(), ControlError> {
        self.0.call(&Request::CaptureDiscard).map(|_| ())
    }

    /// Stops the server host's capture and copies its files into `dir`, each checked by size
    /// and SHA-256, then discards them there. Returns the summary and the local files.
    pub fn capture_collect(
        &mut self,
        dir: &std::path::Path,
    ) -> Result<(CaptureStopped, Vec<std::path::PathBuf>), FetchError> {
        let stopped = self.capture_stop()?;
        let files =
            serve_capture::fetch(&stopped.files, dir, |n, o, l| self.capture_read(n, o, l))?;
        self.capture_discard()?;
        Ok((stopped, files))
    }
}

/// The fewest IPv4 prefixes that cover exactly `addrs` (in any order, repeats allowed): what
/// a controller announces for its client address pool.
pub fn ranges_of(addrs: &[std::net::Ipv4Addr]) -> Vec<IpNet> {
    let mut a: Vec<u64> = addrs.iter().map(|&x| u32::from(x) as u64).collect();
    a.sort_unstable();
    a.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < a.len() {
        // a run of consecutive addresses [lo, hi]
        let mut j = i;
        while j + 1 < a.len() && a[j + 1] == a[j] + 1 {
            j += 1;
        }
        let (mut lo, hi) = (a[i], a[j]);
        while lo <= hi {
            // the largest aligned block starting at lo that stays inside the run
            let mut size = if lo == 0 {
                1u64 << 32
            } else {
                lo & lo.wrapping_neg()
            };
            while lo + size - 1 > hi {
                size >>= 1;
            }
            out.push(IpNet {
                addr: std::net::IpAddr::V4((lo as u32).into()),
                prefix: 32 - size.trailing_zeros() as u8,
            });
            lo += size;
        }
        i = j + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn strs(r: &[IpNet]) -> Vec<String> {
        r.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn ranges_cover_exactly_the_pool() {
        let a = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            strs(&ranges_of(&[a("10.0.0.1")])),
            ["10.0.0.1/32"],
            "a single address"
        );
        // the lab's pool: 198.19.0.1 .. 198.19.31.254
        let pool: Vec<Ipv4Addr> = (1..8191u32)
            .map(|i| Ipv4Addr::from(u32::from(a("198.19.0.0")) + i))
            .collect();
        let r = ranges_of(&pool);
        let n: u64 = r.iter().map(|n| 1u64 << (32 - n.prefix)).sum();
        assert_eq!(n, 8190, "{:?}", strs(&r));
        assert!(r.len() <= 26, "{:?}", strs(&r));
        for ip in [a("198.19.0.1"), a("198.19.17.3"), a("198.19.31.254")] {
            assert!(r.iter().any(|n| n.contains(IpAddr::V4(ip))));
        }
        for ip in [a("198.19.0.0"), a("198.19.31.255"), a("198.18.0.1")] {
            assert!(!r.iter().any(|n| n.contains(IpAddr::V4(ip))), "{ip}");
        }
        assert_eq!(
            strs(&ranges_of(&[
                a("10.0.0.3"),
                a("10.0.0.2"),
                a("10.0.0.2"),
                a("10.0.0.9")
            ])),
            ["10.0.0.2/31", "10.0.0.9/32"]
        );
        assert_eq!(strs(&ranges_of(&[a("0.0.0.0")])), ["0.0.0.0/32"]);
        assert!(ranges_of(&[]).is_empty());
    }

    #[test]
    fn the_allow_list_admits_only_the_announced_ranges() {
        let allow = AllowList::anyone();
        assert!(allow.allows("203.0.113.9".parse().unwrap()));
        allow.set(vec!["198.19.0.0/19".parse().unwrap()]);
        assert!(allow.allows("198.19.3.4".parse().unwrap()));
        assert!(allow.allows("::ffff:198.19.3.4".parse().unwrap()));
        assert!(!allow.allows("198.18.0.2".parse().unwrap()));
        assert!(!AllowList::only(vec![]).allows("198.19.3.4".parse().unwrap()));
    }

    /// `mimic serve` in miniature: the replay port refuses every client until the controller
    /// announces its ranges, then only those outside them; a controller without the right
    /// key is refused; the legitimate controller and clients are served throughout.
    #[test]
    fn the_replay_port_serves_only_announced_clients() {
        use crate::preamble::{After, Preamble};
        use std::io::{Read, Write};
        use std::net::SocketAddr;

        let tmp = tempfile::Builder::new()
            .prefix("mimic-serve-")
            .tempdir()
            .unwrap();
        let pki = tmp.path().join("pki");
        mimic_control::pki::init(&pki, &Default::default()).unwrap();
        let ctl_addr = ControlAddr::Unix(tmp.path().join("serve.sock"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(async { crate::server::bind("127.0.0.1:0".parse().unwrap()) })
            .unwrap();
        let data: SocketAddr = listener.local_addr().unwrap();
        let stats = Stats::default();
        // what `mimic serve --control` starts with: nobody
        let allow = AllowList::only(vec![]);
        let (stop_tx, stop_rx) = watch::channel(false);
        let ctl = spawn(
            Listener::bind(&ctl_addr).unwrap(),
            RoleTls::load(&pki, ROLE).unwrap(),
            stats.clone(),
            allow.clone(),
            None,
            stop_tx.clone(),
        )
        .unwrap();
        let srv = {
            let (stats, allow) = (stats.clone(), allow.clone());
            std::thread::spawn(move || {
                rt.block_on(crate::server::serve_allowed(
                    listener, stats, allow, stop_rx,
                ))
            })
        };

        // one exchange from `from`: the response bytes it got
        let exchange = |from: &str| -> Vec<u8> {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into())
                .unwrap();
            s.connect(&data.into()).unwrap();
            let mut s: std::net::TcpStream = s.into();
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            let p = Preamble {
                conn_id: 1,
                seq: 0,
                after: After::Fin,
                req_bytes: 52,
                resp_bytes: 100,
                header_bytes: 0,
                response_delay_us: 0,
                query_delay_us: 0,
            };
            let _ = s.write_all(&p.encode());
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got
        };
        let tls = ControllerTls::load(&pki).unwrap();
        let refused = || {
            ServeClient::connect(&ctl_addr, &tls)
                .unwrap()
                .stats()
                .unwrap()
                .refused
        };

        assert!(
            exchange("127.0.0.1").is_empty(),
            "served before any announcement"
        );
        assert_eq!(refused(), 1);

        // a controller without the right key cannot open the port
        let other = tmp.path().join("other");
        mimic_control::pki::init(&other, &Default::default()).unwrap();
        std::fs::copy(pki.join("ca.crt"), other.join("ca.crt")).unwrap();
        let e = ServeClient::connect(
            &ctl_addr,
            &ControllerTls::load_identity(&other, "controller").unwrap(),
        )
        .err()
        .expect("refused");
        assert!(matches!(e, ControlError::Auth { .. }), "{e}");
        assert_eq!(allow.ranges(), Some(vec![]));

        let mut c = ServeClient::connect(&ctl_addr, &tls).unwrap();
        c.allow(&ranges_of(&["127.0.0.2".parse().unwrap()]))
            .unwrap();
        assert_eq!(
            exchange("127.0.0.2").len(),
            100,
            "an announced client is served"
        );
        assert!(
            exchange("127.0.0.1").is_empty(),
            "an address outside the ranges"
        );
        assert_eq!(exchange("127.0.0.2").len(), 100, "and serving goes on");
        let st = c.stats().unwrap();
        assert_eq!(
            (st.refused, st.connections, st.exchanges),
            (2, 2, 2),
            "{st:?}"
        );

        // what the server host runs, as the replay database records it
        let info = c.info(Some("127.0.0.2".parse().unwrap())).unwrap();
        let proc = |p: &str| std::fs::read_to_string(p).unwrap().trim().to_string();
        assert_eq!(info.kernel, proc("/proc/sys/kernel/osrelease"));
        assert!(!info.hostname.is_empty());
        let st = info.stack.as_ref().unwrap_or_else(|| panic!("{info:?}"));
        assert_eq!(
            st.cc.as_deref(),
            Some(proc("/proc/sys/net/ipv4/tcp_congestion_control").as_str())
        );
        assert_eq!(
            st.sack,
            Some(proc("/proc/sys/net/ipv4/tcp_sack") != "0"),
            "{st:?}"
        );
        assert!(st.rmem.is_some() && st.wmem.is_some(), "{st:?}");

        c.shutdown().unwrap();
        let fin = srv.join().unwrap();
        assert_eq!(fin.refused, 2);
        ctl.stop();
        assert!(!tmp.path().join("serve.sock").exists());
    }
}
