//! The client emulator: one task per replayed connection. It opens the connection from its
//! own source address and port at the planned time, with the recorded MSS and receive window,
//! sends each request (a preamble, then filler up to the recorded size) after the recorded
//! think time, reads the whole response, and closes as the original client did.

use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::hrtimer::HrTimer;
use crate::preamble::{self, After, Preamble};
use crate::workload::{Close, ConnSpec, RequestTiming};

/// One connection to replay.
#[derive(Clone, Debug)]
pub struct Planned {
    pub index: usize,
    pub spec: Arc<ConnSpec>,
    pub local: SocketAddrV4,
    pub server: SocketAddr,
    /// When the SYN leaves.
    pub start: Instant,
    /// Give up (and record a timeout) this long after `start`.
    pub limit: Duration,
    pub request_timing: RequestTiming,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The source address or port could not be bound.
    Bind,
    Refused,
    Reset,
    Timeout,
    /// The server closed before the whole response arrived.
    ShortResponse,
    Other(String),
}

impl Failure {
    pub fn as_str(&self) -> String {
        match self {
            Failure::Bind => "bind".into(),
            Failure::Refused => "refused".into(),
            Failure::Reset => "reset".into(),
            Failure::Timeout => "timeout".into(),
            Failure::ShortResponse => "short_response".into(),
            Failure::Other(s) => format!("error: {s}"),
        }
    }

    fn from_io(e: &std::io::Error) -> Failure {
        use std::io::ErrorKind::*;
        match e.kind() {
            ConnectionRefused => Failure::Refused,
            ConnectionReset | ConnectionAborted | BrokenPipe => Failure::Reset,
            TimedOut => Failure::Timeout,
            AddrInUse | AddrNotAvailable => Failure::Bind,
            _ => Failure::Other(e.to_string()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub index: usize,
    /// The source address and port the connection used.
    pub local: SocketAddrV4,
    pub result: Result<(), Failure>,
    /// How late the SYN left compared with the plan.
    pub start_lateness: Duration,
    pub exchanges_done: usize,
    /// First request byte written to last response byte read (the client's view).
    pub response_time: Option<Duration>,
}

/// Smallest and largest MSS the client asks for (Linux refuses values below 88, and replay
/// runs over Ethernet-sized MTUs).
const MSS_RANGE: (u16, u16) = (536, 8960);

fn socket(p: &Planned) -> Result<socket2::Socket, Failure> {
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .map_err(|e| Failure::Other(format!("socket: {e}")))?;
    let _ = s.set_reuse_address(true);
    if let Some(mss) = p.spec.mss_client {
        // TCP_MAXSEG before connect sets the MSS the SYN advertises
        let _ = s.set_tcp_mss(mss.clamp(MSS_RANGE.0, MSS_RANGE.1) as u32);
    }
    if stalls(&p.spec) {
        // a client that stopped reading: a receive buffer that holds about its window (the
        // kernel doubles it for overhead), so that when it stops reading its window closes
        // after about as many bytes as the original's did
        let rwin = stall_window(&p.spec);
        let _ = s.set_recv_buffer_size(rwin as usize);
        set_window_clamp(&s, rwin as u32);
    } else if window_grew(&p.spec) {
        // the original's window grew past its first (Linux's receive-buffer autotuning): this
        // client's kernel grows its own the same way, left alone. A fixed buffer and clamp at
        // the first window kept replays from filling the queues their originals overflowed;
        // one the largest window's size from the start opened the window at once and
        // overflowed more than the originals (autotuning overrides a clamp as it grows).
    } else if let Some(rwin) = p.spec.rwin_bytes.filter(|w| *w > 0) {
        // the window this client advertises: a receive buffer big enough for it, and the
        // window clamped to the recorded size
        let rwin = rwin.clamp(2048, 64 << 20);
        let _ = s.set_recv_buffer_size((rwin * 2) as usize);
        set_window_clamp(&s, rwin as u32);
    }
    let _ = s.set_tcp_nodelay(true);
    s.bind(&SocketAddr::V4(p.local).into())
        .map_err(|e| Failure::from_io(&e))?;
    s.set_nonblocking(true)
        .map_err(|e| Failure::Other(e.to_string()))?;
    Ok(s)
}

/// Whether the original client's window grew past the one it advertised with its first
/// request (`rwin_max_bytes` over `rwin_bytes`): its stack tunes its receive buffer.
fn window_grew(spec: &ConnSpec) -> bool {
    matches!((spec.rwin_bytes, spec.rwin_max_bytes), (Some(first), Some(max)) if max > first)
}

/// Whether the original client stopped reading during a response (its window closed).
fn stalls(spec: &ConnSpec) -> bool {
    spec.exchanges.iter().any(|e| e.zero_window_us > 0)
}

/// The receive window of a client that stops reading: the recorded one, else 64 KiB.
fn stall_window(spec: &ConnSpec) -> u64 {
    spec.rwin_bytes
        .filter(|w| *w > 0)
        .unwrap_or(64 << 10)
        .clamp(2048, 64 << 20)
}

/// The client stops reading (at the response byte the plan says) as the original did: it
/// waits until its own advertised window has closed (the kernel's `tcpi_rcv_wnd` is 0), then
/// keeps it closed for `closed_for` before it reads on, so the server is held back as long as
/// the original's was. Returns at once if the rest of the response (`remaining` bytes) is
/// already in the socket: nothing is left for the server to hold back. Where the kernel does
/// not report the window (before Linux 6.2) the pause starts when reading stops.
async fn pause_reading(s: &TcpStream, remaining: u64, closed_for: Duration) {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    loop {
        if crate::sys::unread_bytes(fd).is_some_and(|n| n >= remaining) {
            return;
        }
        match crate::sys::advertised_window(fd) {
            Some(0) | None => break,
            Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
    tokio::time::sleep(closed_for).await;
}

/// TCP_WINDOW_CLAMP: the largest window the socket advertises.
fn set_window_clamp(s: &socket2::Socket, bytes: u32) {
    use std::os::fd::AsRawFd;
    let v = bytes.min(i32::MAX as u32) as libc::c_int;
    let _ = crate::sys::setsockopt_int(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, v);
}

/// Replays one connection. Call it a little before `p.start`: the socket is made and bound
/// at once, and the timer thread sends the SYN at `p.start`.
pub async fn run(p: Planned, timer: &HrTimer) -> Outcome {
    let mut out = Outcome {
        index: p.index,
        local: p.local,
        result: Ok(()),
        start_lateness: Duration::ZERO,
        exchanges_done: 0,
        response_time: None,
    };
    let deadline = p.start + p.limit;
    let r = tokio::time::timeout_at(deadline.into(), body(&p, timer, &mut out)).await;
    out.result = match r {
        Ok(r) => r,
        Err(_) => Err(Failure::Timeout),
    };
    out
}

/// Connects `sock` at `at`: the timer thread starts the non-blocking connect (the SYN leaves
/// then), and the task waits for its outcome. Returns the stream and the instant the connect
/// was issued.
async fn connect_at(
    sock: socket2::Socket,
    server: SocketAddr,
    at: Instant,
    timer: &HrTimer,
) -> Result<(TcpStream, Instant), Failure> {
    let ((sock, r), issued) = timer
        .run_at(at, move || {
            let r = sock.connect(&server.into());
            (sock, r)
        })
        .await;
    match r {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(Failure::from_io(&e)),
    }
    let s = TcpStream::from_std(std::net::TcpStream::from(sock))
        .map_err(|e| Failure::Other(format!("registering the socket: {e}")))?;
    // as tokio's own connect: writable once the handshake ends, then the socket's error
    s.writable().await.map_err(|e| Failure::from_io(&e))?;
    if let Some(e) = s.take_error().map_err(|e| Failure::from_io(&e))? {
        return Err(Failure::from_io(&e));
    }
    Ok((s, issued))
}

async fn body(p: &Planned, timer: &HrTimer, out: &mut Outcome) -> Result<(), Failure> {
    let sock = socket(p)?;
    let (mut s, issued) = connect_at(sock, p.server, p.start, timer).await?;
    out.start_lateness = issued.saturating_duration_since(p.start);
    let connected = Instant::now();
    let spec = &p.spec;
    let n = spec.exchanges.len();
    let mut buf = vec![0u8; 65536];
    let mut prev_done = connected;
    let mut first_req: Option<Instant> = None;
    for (k, e) in spec.exchanges.iter().enumerate() {
        // the client's pause: after the handshake, then after each response; open loop, the
        // request's recorded time if that is later (the SYN left at `p.start` as recorded)
        let mut at = prev_done + Duration::from_micros(e.think_time_us);
        if let (RequestTiming::Recorded, Some(off)) = (p.request_timing, e.offset_us) {
            at = at.max(p.start + Duration::from_micros(off));
        }
        let last = k + 1 == n;
        let after = match (last, spec.close) {
            (true, Close::ServerFin) => After::Fin,
            (true, Close::ServerRst) => After::Rst,
            _ => After::Stay,
        };
        let pre = Preamble {
            conn_id: spec.orig_id as u64,
            seq: e.seq,
            after,
            req_bytes: e.req_bytes,
            resp_bytes: e.resp_bytes,
            header_bytes: e.header_bytes,
            response_delay_us: e.response_delay_us.min(u32::MAX as u64) as u32,
            query_delay_us: e.query_delay_us.min(u32::MAX as u64) as u32,
        };
        let bytes = pre.encode();
        let req_total = e.req_bytes.max(preamble::LEN as u64) as usize;
        let mut req = Vec::with_capacity(req_total);
        req.extend_from_slice(&bytes);
        req.resize(req_total, 0);
        // the timer thread sends what the socket takes when the request is due, this task the rest
        let (s2, req, r, sent_at) = timer.send_at(s, req, at).await;
        s = s2;
        let n = r.map_err(|e| Failure::from_io(&e))?;
        s.write_all(&req[n..])
            .await
            .map_err(|e| Failure::from_io(&e))?;
        first_req.get_or_insert(sent_at);
        let mut left = e.resp_bytes;
        // where this client stops reading: a window's worth before the byte at which the
        // original's window closed, so that its own closes there
        let mut stop_at = (e.zero_window_us > 0)
            .then(|| e.zero_window_at_bytes.saturating_sub(stall_window(spec)));
        while left > 0 {
            let read = e.resp_bytes - left;
            if stop_at.is_some_and(|at| read >= at) {
                stop_at = None;
                pause_reading(&s, left, Duration::from_micros(e.zero_window_us)).await;
            }
            let mut k = left.min(buf.len() as u64);
            if let Some(at) = stop_at {
                k = k.min(at - read);
            }
            let k = k as usize;
            let got = s
                .read(&mut buf[..k])
                .await
                .map_err(|e| Failure::from_io(&e))?;
            if got == 0 {
                return Err(Failure::ShortResponse);
            }
            left -= got as u64;
        }
        prev_done = Instant::now();
        out.exchanges_done = k + 1;
    }
    out.response_time = first_req.map(|f| prev_done.duration_since(f));
    match spec.close {
        Close::ClientFin => {
            let _ = s.shutdown().await;
            // wait for the server's FIN
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        }
        Close::ClientRst => {
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
        }
        Close::ServerFin | Close::ServerRst => {
            // the server closes after the last response; answer its FIN with ours
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_whose_window_grew_is_left_to_tune_its_own() {
        let mut c = ConnSpec {
            rwin_bytes: Some(64_512),
            rwin_max_bytes: Some(174_080),
            ..ConnSpec::bare(1)
        };
        assert!(window_grew(&c));
        // a window that never grew (or a database before migration 6): clamped, as before
        c.rwin_max_bytes = Some(64_512);
        assert!(!window_grew(&c));
        c.rwin_max_bytes = None;
        assert!(!window_grew(&c));
    }
}
