//! The server emulator (`mimic serve`): accepts replayed connections, reads each request's
//! preamble, waits the recorded response delay, writes the header part, waits the query
//! delay, writes the rest, and closes as recorded. Delays are kept by [`HrTimer`]; how late
//! each wake-up was is kept in the statistics the control channel reports.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
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
    pub max_us: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStats {
    pub connections: u64,
    pub active: u64,
    pub exchanges: u64,
    pub bytes_out: u64,
    /// Connections closed because a request did not start with a valid preamble.
    pub bad_preamble: u64,
    /// Connections that ended with an I/O error (reset in the middle of an exchange, …).
    pub io_errors: u64,
    /// Connections the client reset between exchanges: how a recorded RST close ends.
    #[serde(default)]
    pub client_resets: u64,
    /// Connections the client closed in the middle of an exchange.
    pub early_close: u64,
    pub response_delay_error: DelayError,
    pub query_delay_error: DelayError,
}

struct Inner {
    stats: ServerStats,
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
            let d = |h: &Histogram<u64>| DelayError {
                count: h.len(),
                p50_us: if h.is_empty() {
                    0
                } else {
                    h.value_at_quantile(0.5)
                },
                p99_us: if h.is_empty() {
                    0
                } else {
                    h.value_at_quantile(0.99)
                },
                max_us: if h.is_empty() { 0 } else { h.max() },
            };
            let mut s = i.stats.clone();
            s.response_delay_error = d(&i.resp_err);
            s.query_delay_error = d(&i.query_err);
            s
        })
    }

    pub fn reset(&self) {
        self.with(|i| {
            let active = i.stats.active;
            i.stats = ServerStats {
                active,
                ..ServerStats::default()
            };
            i.resp_err.reset();
            i.query_err.reset();
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

/// Serves until `stop` turns true; returns the final statistics.
pub async fn serve(
    listener: TcpListener,
    stats: Stats,
    mut stop: watch::Receiver<bool>,
) -> ServerStats {
    let timer = HrTimer::global();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
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

const FILL: [u8; 65536] = [0u8; 65536];

async fn write_n(sock: &mut TcpStream, mut n: u64) -> std::io::Result<()> {
    while n > 0 {
        let k = n.min(FILL.len() as u64) as usize;
        sock.write_all(&FILL[..k]).await?;
        n -= k as u64;
    }
    Ok(())
}

async fn discard_n(sock: &mut TcpStream, mut n: u64, buf: &mut [u8]) -> std::io::Result<bool> {
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        let got = sock.read(&mut buf[..k]).await?;
        if got == 0 {
            return Ok(false);
        }
        n -= got as u64;
    }
    Ok(true)
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

async fn connection(mut sock: TcpStream, stats: &Stats, timer: &HrTimer) -> Outcome {
    let _ = sock.set_nodelay(true);
    let mut buf = vec![0u8; 16384];
    loop {
        let mut pre = [0u8; preamble::LEN];
        match sock.read_exact(&mut pre).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Outcome::Done,
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
        match discard_n(&mut sock, p.req_bytes - preamble::LEN as u64, &mut buf).await {
            Ok(true) => {}
            Ok(false) => return Outcome::EarlyClose,
            Err(_) => return Outcome::Io,
        }
        let req_done = Instant::now();
        let r = async {
            let target = req_done + Duration::from_micros(p.response_delay_us as u64);
            timer.sleep_until(target).await;
            // lateness when this task runs again (timer thread plus tokio scheduling), just
            // before the write, not when the timer thread fired
            let resumed = Instant::now();
            stats.with(|i| i.resp_err.saturating_record(lateness_us(resumed, target)));
            let first_write = Instant::now();
            write_n(&mut sock, p.header_bytes).await?;
            let rest = p.resp_bytes - p.header_bytes;
            if rest > 0 {
                if p.query_delay_us > 0 {
                    let target = first_write + Duration::from_micros(p.query_delay_us as u64);
                    timer.sleep_until(target).await;
                    let resumed = Instant::now();
                    stats.with(|i| i.query_err.saturating_record(lateness_us(resumed, target)));
                }
                write_n(&mut sock, rest).await?;
            }
            std::io::Result::Ok(())
        }
        .await;
        if r.is_err() {
            return Outcome::Io;
        }
        stats.with(|i| {
            i.stats.exchanges += 1;
            i.stats.bytes_out += p.resp_bytes;
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
