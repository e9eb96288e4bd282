//! The server emulator (`mimic serve`): accepts replayed connections, reads each request's
//! preamble, waits the recorded response delay, writes the header part, waits the query
//! delay, writes the rest, and closes as recorded. Delays are kept by [`HrTimer`]; how late
//! each wake-up was is kept in the statistics the control channel reports.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mimic_netemu::classify::IpNet;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::hrtimer::HrTimer;
use crate::preamble::{self, After, Preamble};

/// Delay-keeping error: how much later than asked the server wrote (µs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DelayError {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    #[serde(default)]
    pub p999_us: u64,
    pub max_us: u64,
    /// Delays kept more than 1 ms late.
    #[serde(default)]
    pub over_1ms: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub connections: u64,
    pub active: u64,
    pub exchanges: u64,
    pub bytes_out: u64,
    /// Request bytes of the exchanges answered (preambles included).
    #[serde(default)]
    pub bytes_in: u64,
    /// Connections closed because a request did not start with a valid preamble.
    pub bad_preamble: u64,
    /// Connections that ended with an I/O error (reset in the middle of an exchange, …).
    pub io_errors: u64,
    /// Connections the client reset between exchanges: how a recorded RST close ends.
    #[serde(default)]
    pub client_resets: u64,
    /// Connections the client closed in the middle of an exchange.
    pub early_close: u64,
    /// Connections refused (reset at once) because the client's address is outside the ranges
    /// the controller announced.
    #[serde(default)]
    pub refused: u64,
    pub response_delay_error: DelayError,
    pub query_delay_error: DelayError,
    /// Whether the timer thread that keeps the delays ran real-time within its budget
    /// (`HrTimer::realtime`; None before it started).
    #[serde(default)]
    pub timer_realtime: Option<bool>,
}

impl ServerStats {
    /// The counters of `self` minus those of an earlier `base` (`active` is a level, kept).
    fn since(&self, base: &ServerStats) -> ServerStats {
        ServerStats {
            connections: self.connections - base.connections,
            active: self.active,
            exchanges: self.exchanges - base.exchanges,
            bytes_out: self.bytes_out - base.bytes_out,
            bytes_in: self.bytes_in - base.bytes_in,
            bad_preamble: self.bad_preamble - base.bad_preamble,
            io_errors: self.io_errors - base.io_errors,
            client_resets: self.client_resets - base.client_resets,
            early_close: self.early_close - base.early_close,
            refused: self.refused - base.refused,
            ..ServerStats::default()
        }
    }
}

struct Inner {
    /// Counted since the server started; never reset.
    stats: ServerStats,
    /// The counters at the last [`Stats::reset`]: a snapshot reports what happened since.
    base: ServerStats,
    resp_err: Histogram<u64>,
    query_err: Histogram<u64>,
}

/// Shared statistics of a running server.
#[derive(Clone)]
pub struct Stats(Arc<Mutex<Inner>>);

impl Default for Stats {
    fn default() -> Self {
        let h = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds");
        Stats(Arc::new(Mutex::new(Inner {
            stats: ServerStats::default(),
            base: ServerStats::default(),
            resp_err: h(),
            query_err: h(),
        })))
    }
}

impl Stats {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn snapshot(&self) -> ServerStats {
        self.with(|i| {
            let d = |h: &Histogram<u64>| {
                let q = |x: f64| {
                    if h.is_empty() {
                        0
                    } else {
                        h.value_at_quantile(x)
                    }
                };
                DelayError {
                    count: h.len(),
                    p50_us: q(0.5),
                    p99_us: q(0.99),
                    p999_us: q(0.999),
                    max_us: if h.is_empty() { 0 } else { h.max() },
                    // values are lateness + 1 µs (see `lateness_us`)
                    over_1ms: if h.is_empty() || h.max() <= 1001 {
                        0
                    } else {
                        h.count_between(1002, h.max())
                    },
                }
            };
            let mut s = i.stats.since(&i.base);
            s.response_delay_error = d(&i.resp_err);
            s.query_delay_error = d(&i.query_err);
            s.timer_realtime = HrTimer::realtime();
            s
        })
    }

    /// Starts a new measurement: later snapshots count from here (the totals keep counting).
    pub fn reset(&self) {
        self.with(|i| {
            i.base = i.stats.clone();
            i.resp_err.reset();
            i.query_err.reset();
        })
    }

    /// The counters since the server started, whatever resets the control channel made (what
    /// `/metrics` exposes: Prometheus counters never go back). Delay errors are not included.
    pub fn totals(&self) -> ServerStats {
        self.with(|i| {
            let mut s = i.stats.clone();
            s.timer_realtime = HrTimer::realtime();
            s
        })
    }
}

/// Binds the replay port with a deep accept queue.
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(8192)?;
    TcpListener::from_std(s.into())
}

/// The client address ranges the replay port accepts connections from: the controller
/// announces them over the control channel (`allow`), or `mimic serve --allow` sets them.
/// `None` accepts anyone (a `mimic serve` without a control channel or `--allow`).
#[derive(Clone, Debug, Default)]
pub struct AllowList(Arc<RwLock<Option<Vec<IpNet>>>>);

impl AllowList {
    /// Accepts connections from anyone.
    pub fn anyone() -> AllowList {
        AllowList::default()
    }

    /// Accepts connections only from `ranges` (none at all when it is empty).
    pub fn only(ranges: Vec<IpNet>) -> AllowList {
        AllowList(Arc::new(RwLock::new(Some(ranges))))
    }

    /// Replaces the ranges.
    pub fn set(&self, ranges: Vec<IpNet>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(ranges);
    }

    /// The ranges in force (`None`: anyone).
    pub fn ranges(&self) -> Option<Vec<IpNet>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a connection from `ip` is served (an IPv4-mapped IPv6 address counts as the
    /// IPv4 address).
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match &*self.0.read().unwrap_or_else(|p| p.into_inner()) {
            None => true,
            Some(r) => r.iter().any(|n| n.contains(ip)),
        }
    }
}

/// Serves everyone until `stop` turns true; returns the final statistics.
pub async fn serve(
    listener: TcpListener,
    stats: Stats,
    stop: watch::Receiver<bool>,
) -> ServerStats {
    serve_allowed(listener, stats, AllowList::anyone(), stop).await
}

/// Serves the clients `allow` admits until `stop` turns true; a connection from any other
/// address is reset at once and counted (`refused`). Returns the final statistics.
pub async fn serve_allowed(
    listener: TcpListener,
    stats: Stats,
    allow: AllowList,
    mut stop: watch::Receiver<bool>,
) -> ServerStats {
    let timer = HrTimer::global();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, peer)) if !allow.allows(peer.ip()) => {
                    stats.with(|i| i.stats.refused += 1);
                    tracing::debug!("refused a connection from {peer}: outside the allowed client ranges");
                    // a reset, not an orderly close: nothing was served
                    let _ = socket2::SockRef::from(&sock).set_linger(Some(Duration::ZERO));
                    drop(sock);
                }
                Ok((sock, _peer)) => {
                    let stats = stats.clone();
                    stats.with(|i| { i.stats.connections += 1; i.stats.active += 1; });
                    tokio::spawn(async move {
                        let outcome = connection(sock, &stats, timer).await;
                        stats.with(|i| {
                            i.stats.active -= 1;
                            match outcome {
                                Outcome::Done => {}
                                Outcome::BadPreamble => i.stats.bad_preamble += 1,
                                Outcome::EarlyClose => i.stats.early_close += 1,
                                Outcome::ClientReset => i.stats.client_resets += 1,
                                Outcome::Io => i.stats.io_errors += 1,
                            }
                        });
                    });
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stop.changed() => {
                if *stop.borrow() {
                    break;
                }
            }
        }
    }
    stats.snapshot()
}

enum Outcome {
    Done,
    BadPreamble,
    EarlyClose,
    ClientReset,
    Io,
}

static FILL: [u8; 65536] = [0u8; 65536];

async fn write_n(sock: &mut TcpStream, mut n: u64) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(FILL.len() as u64) as usize;
        sock.write_all(&FILL[..k]).await?;
        n -= k as u64;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes, or fewer if the peer closes (the count is returned), and
/// notes in `last` when the kernel received the newest of them.
async fn read_ts(
    sock: &TcpStream,
    buf: &mut [u8],
    last: &mut Option<Instant>,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        let (n, ts) = sock
            .async_io(tokio::io::Interest::READABLE, || recv_ts(fd, rest))
            .await?;
        if n == 0 {
            break;
        }
        got += n;
        if let Some(ts) = ts {
            *last = Some(ts);
        }
    }
    Ok(got)
}

/// Reads and throws away `n` bytes; false if the peer closed first.
async fn discard_n(
    sock: &TcpStream,
    mut n: u64,
    buf: &mut [u8],
    last: &mut Option<Instant>,
) -> std::io::Result<bool> {
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        let got = read_ts(sock, &mut buf[..k], last).await?;
        if got < k {
            return Ok(false);
        }
        n -= got as u64;
    }
    Ok(true)
}

/// Asks the kernel to timestamp received data (SO_TIMESTAMPNS; for TCP, `recvmsg` reports the
/// receive time of the newest segment it read from).
fn enable_rx_timestamps(sock: &TcpStream) {
    use std::os::fd::AsRawFd;
    // without it the delays count from when the task read the request, as before
    let _ = crate::sys::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
}

/// One non-blocking `recvmsg`: the bytes read and, when the kernel gave one, the receive time
/// of the data as an `Instant`.
fn recv_ts(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Option<Instant>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // room for one SCM_TIMESTAMPNS (a cmsghdr and a timespec), u64-aligned
    let mut ctrl = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    // SAFETY: recvmsg writes at most iov_len bytes into buf and msg_controllen into ctrl,
    // both live for the call.
    let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ts = None;
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within msg_controllen;
    // an SCM_TIMESTAMPNS payload is one timespec (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let t: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const _);
                ts = Some(realtime_to_instant(t));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((r as usize, ts))
}

/// A CLOCK_REALTIME kernel timestamp as an `Instant` (µs-accurate: both clocks are read now).
fn realtime_to_instant(t: libc::timespec) -> Instant {
    let now = Instant::now();
    let at = std::time::UNIX_EPOCH + Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
    let age = std::time::SystemTime::now()
        .duration_since(at)
        .unwrap_or(Duration::ZERO)
        .min(Duration::from_secs(60));
    now.checked_sub(age).unwrap_or(now)
}

/// Waits (up to a minute) until every byte written has been acknowledged by the peer.
async fn wait_drained(sock: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int: the bytes not yet acknowledged.
        let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
        if r != 0 || n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn lateness_us(woke: Instant, target: Instant) -> u64 {
    woke.saturating_duration_since(target).as_micros() as u64 + 1
}

/// Writes `n` filler bytes starting at `at`: the timer thread sends what the socket takes
/// without blocking then, the task the rest. Returns the stream and the instant the first
/// bytes were handed to the kernel.
async fn write_at(
    sock: TcpStream,
    n: u64,
    at: Instant,
    timer: &HrTimer,
) -> std::io::Result<(TcpStream, Instant)> {
    let now = n.min(FILL.len() as u64) as usize;
    let (mut sock, _, r, sent_at) = timer.send_at(sock, &FILL[..now], at).await;
    let sent = r? as u64;
    write_n(&mut sock, n - sent).await?;
    Ok((sock, sent_at))
}

async fn connection(mut sock: TcpStream, stats: &Stats, timer: &HrTimer) -> Outcome {
    let _ = sock.set_nodelay(true);
    enable_rx_timestamps(&sock);
    let mut buf = vec![0u8; 16384];
    loop {
        let mut pre = [0u8; preamble::LEN];
        // when the kernel received the request's last bytes: the response delay counts from
        // there, so a late read by this task shows as lateness
        let mut arrived = None;
        match read_ts(&sock, &mut pre, &mut arrived).await {
            Ok(preamble::LEN) => {}
            Ok(0) => return Outcome::Done,
            Ok(_) => return Outcome::EarlyClose,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Outcome::ClientReset
            }
            Err(_) => return Outcome::Io,
        }
        let p = match Preamble::decode(&pre) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("closing a connection: {e}");
                return Outcome::BadPreamble;
            }
        };
        match discard_n(
            &sock,
            p.req_bytes - preamble::LEN as u64,
            &mut buf,
            &mut arrived,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => return Outcome::EarlyClose,
            Err(_) => return Outcome::Io,
        }
        let req_done = arrived.unwrap_or_else(Instant::now);
        // lateness: when the bytes were handed to the kernel against when they were due
        let target = req_done + Duration::from_micros(p.response_delay_us as u64);
        let first_write = match write_at(sock, p.header_bytes, target, timer).await {
            Ok((s, at)) => {
                sock = s;
                stats.with(|i| i.resp_err.saturating_record(lateness_us(at, target)));
                at
            }
            Err(_) => return Outcome::Io,
        };
        let rest = p.resp_bytes - p.header_bytes;
        if rest > 0 {
            let target = first_write + Duration::from_micros(p.query_delay_us as u64);
            match write_at(sock, rest, target, timer).await {
                Ok((s, at)) => {
                    sock = s;
                    if p.query_delay_us > 0 {
                        stats.with(|i| i.query_err.saturating_record(lateness_us(at, target)));
                    }
                }
                Err(_) => return Outcome::Io,
            }
        }
        stats.with(|i| {
            i.stats.exchanges += 1;
            i.stats.bytes_out += p.resp_bytes;
            i.stats.bytes_in += p.req_bytes;
        });
        match p.after {
            After::Stay => {}
            After::Fin => {
                let _ = sock.shutdown().await;
                // drain until the client closes its side
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
                return Outcome::Done;
            }
            After::Rst => {
                // a reset throws away unsent data: let the client have the whole response first
                wait_drained(&sock).await;
                let _ = socket2::SockRef::from(&sock).set_linger(Some(Duration::ZERO));
                return Outcome::Done;
            }
        }
    }
}
