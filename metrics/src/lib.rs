//! The Prometheus endpoint of the long-running mimic commands (`mimic capture`, `mimic netemu
//! run`, `mimic serve`, each with `--metrics ADDR`).
//!
//! A command registers one [`SnapshotCollector`] that reads the command's own counters at
//! scrape time — the same counters its exit summary prints, never a second tally — and
//! [`Bound::serve`] answers `GET /metrics` (and `HEAD`) on its own thread with the registry in
//! the OpenMetrics text format (`application/openmetrics-text; version=1.0.0`), which
//! Prometheus asks for first and parses natively. Any other path is 404, any other method 405.
//!
//! Requests are answered one at a time, each with a 5 s read/write timeout: a scrape every
//! few seconds is the load this is built for.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
pub use prometheus_client::registry::{Registry, Unit};

/// The content type of [`prometheus_client::encoding::text::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Longest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("--metrics {addr}: cannot listen there: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("starting the metrics thread: {0}")]
    Thread(io::Error),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric family of a scrape: name (without `_total` and without the unit suffix, which
/// the encoder appends), help, unit, type, and its samples by label set.
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    kind: Kind,
    samples: Vec<(Vec<(String, String)>, u64)>,
}

/// The families a collector reports on one scrape.
#[derive(Debug, Default)]
pub struct Families(Vec<Family>);

/// The samples of a family with one label: one `(label = value)` sample per entry.
fn one_label(label: &str, values: &[(&str, u64)]) -> Vec<(Vec<(String, String)>, u64)> {
    values
        .iter()
        .map(|(l, v)| (vec![(label.to_string(), l.to_string())], *v))
        .collect()
}

impl Families {
    fn push(
        &mut self,
        kind: Kind,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        samples: Vec<(Vec<(String, String)>, u64)>,
    ) {
        self.0.push(Family {
            name,
            help,
            unit,
            kind,
            samples,
        });
    }

    /// A counter without labels; exposed as `{name}[_{unit}]_total`.
    pub fn counter(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>, v: u64) {
        self.push(Kind::Counter, name, help, unit, vec![(Vec::new(), v)]);
    }

    /// A counter family with one label, one sample per `(label value, value)`.
    pub fn counter_by(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        label: &str,
        values: &[(&str, u64)],
    ) {
        self.push(Kind::Counter, name, help, unit, one_label(label, values));
    }

    /// A counter family with any labels.
    pub fn counter_labeled(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        samples: Vec<(Vec<(String, String)>, u64)>,
    ) {
        self.push(Kind::Counter, name, help, unit, samples);
    }

    /// A gauge without labels.
    pub fn gauge(&mut self, name: &'static str, help: &'static str, unit: Option<Unit>, v: u64) {
        self.push(Kind::Gauge, name, help, unit, vec![(Vec::new(), v)]);
    }

    /// A gauge family with one label.
    pub fn gauge_by(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        label: &str,
        values: &[(&str, u64)],
    ) {
        self.push(Kind::Gauge, name, help, unit, one_label(label, values));
    }
}

/// A collector that asks a closure for the current values on every scrape.
pub struct SnapshotCollector<F>(F);

impl<F> SnapshotCollector<F>
where
    F: Fn(&mut Families) + Send + Sync + 'static,
{
    pub fn new(f: F) -> Self {
        SnapshotCollector(f)
    }
}

impl<F> fmt::Debug for SnapshotCollector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SnapshotCollector")
    }
}

impl<F> Collector for SnapshotCollector<F>
where
    F: Fn(&mut Families) + Send + Sync + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut fams = Families::default();
        (self.0)(&mut fams);
        for fam in &fams.0 {
            let mt = match fam.kind {
                Kind::Counter => ConstCounter::new(0u64).metric_type(),
                Kind::Gauge => ConstGauge::new(0i64).metric_type(),
            };
            let mut me = encoder.encode_descriptor(fam.name, fam.help, fam.unit.as_ref(), mt)?;
            match fam.samples.as_slice() {
                // one sample without labels: `name value`, not `name{} value`
                [(labels, v)] if labels.is_empty() => put(fam.kind, me, *v)?,
                samples => {
                    for (labels, v) in samples {
                        put(fam.kind, me.encode_family(labels)?, *v)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn put(kind: Kind, enc: MetricEncoder<'_>, v: u64) -> Result<(), fmt::Error> {
    match kind {
        Kind::Counter => ConstCounter::new(v).encode(enc),
        Kind::Gauge => ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)).encode(enc),
    }
}

/// A registry holding one snapshot collector.
pub fn registry_with<F>(f: F) -> Registry
where
    F: Fn(&mut Families) + Send + Sync + 'static,
{
    let mut r = Registry::default();
    r.register_collector(Box::new(SnapshotCollector::new(f)));
    r
}

/// Renders a registry as the OpenMetrics text a scrape returns.
pub fn render(registry: &Registry) -> String {
    let mut s = String::new();
    // encode only fails when writing to the String fails, which it does not
    let _ = prometheus_client::encoding::text::encode(&mut s, registry);
    s
}

/// A listening socket, bound before the command touches anything else (so a taken port fails
/// early) and served once the command's counters exist.
pub struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
}

/// Binds the endpoint's address.
pub fn bind(addr: SocketAddr) -> Result<Bound, MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    Ok(Bound { listener, addr })
}

impl Bound {
    /// The address actually bound (a port 0 request gets its real port here).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the registry on a thread of its own until the process exits.
    pub fn serve(self, registry: Registry) -> Result<SocketAddr, MetricsError> {
        let registry = Arc::new(registry);
        let addr = self.addr;
        thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || {
                for conn in self.listener.incoming() {
                    match conn {
                        // a client that misbehaves only loses its own answer
                        Ok(s) => {
                            let _ = answer(s, &registry);
                        }
                        Err(_) => thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        Ok(addr)
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics { head: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

fn route(head: &[u8]) -> Option<Route> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(Route::BadRequest),
    }
    let path = req.path.unwrap_or("");
    let path = path.split(['?', '#']).next().unwrap_or("");
    let head = match req.method {
        Some("GET") => false,
        Some("HEAD") => true,
        _ => return Some(Route::MethodNotAllowed),
    };
    Some(if path == "/metrics" {
        Route::Metrics { head }
    } else {
        Route::NotFound
    })
}

fn answer(mut s: TcpStream, registry: &Registry) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let route = loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        match route(&buf) {
            Some(r) => break r,
            None if buf.len() > MAX_HEAD => break Route::BadRequest,
            None => {}
        }
    };
    let (status, ctype, body, head) = match route {
        Route::Metrics { head } => ("200 OK", CONTENT_TYPE, render(registry), head),
        Route::NotFound => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
            false,
        ),
        Route::MethodNotAllowed => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".to_string(),
            false,
        ),
        Route::BadRequest => (
            "400 Bad Request",
            "text/plain; charset=utf-8",
            "bad request\n".to_string(),
            false,
        ),
    };
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head {
        out.extend_from_slice(body.as_bytes());
    }
    s.write_all(&out)?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, req: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(Route::Metrics { head: false })
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Some(Route::Metrics { head: false })
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Some(Route::Metrics { head: true })
        );
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost"), None);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Some(Route::NotFound));
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Some(Route::MethodNotAllowed)
        );
        assert_eq!(route(b"\x00\x01 garbage\r\n\r\n"), Some(Route::BadRequest));
    }

    #[test]
    fn serves_the_collector_values_in_openmetrics() {
        let n = Arc::new(std::sync::atomic::AtomicU64::new(7));
        let n2 = n.clone();
        let reg = registry_with(move |f| {
            f.counter(
                "mimic_test_packets",
                "Packets.",
                None,
                n2.load(std::sync::atomic::Ordering::Relaxed),
            );
            f.counter_by(
                "mimic_test_dropped_packets",
                "Drops by cause.",
                None,
                "cause",
                &[("queue", 1), ("loss", 2)],
            );
            f.gauge("mimic_test_pipes", "Pipes.", None, 3);
            f.counter("mimic_test_received", "Bytes.", Some(Unit::Bytes), 100);
        });
        let addr = bind("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .serve(reg)
            .unwrap();
        let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains(CONTENT_TYPE), "{r}");
        assert!(r.contains("\nmimic_test_packets_total 7\n"), "{r}");
        assert!(
            r.contains("\nmimic_test_dropped_packets_total{cause=\"loss\"} 2\n"),
            "{r}"
        );
        assert!(r.contains("\nmimic_test_pipes 3\n"), "{r}");
        assert!(r.contains("\nmimic_test_received_bytes_total 100\n"), "{r}");
        assert!(r.ends_with("# EOF\n"), "{r}");
        // read at scrape time
        n.store(9, std::sync::atomic::Ordering::Relaxed);
        let r = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(r.contains("\nmimic_test_packets_total 9\n"), "{r}");
        let r = get(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = get(addr, "GET /other HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"), "{r}");
        let r = get(addr, "DELETE /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 405 Method Not Allowed\r\n") && r.contains("Allow: GET, HEAD"),
            "{r}"
        );
    }

    #[test]
    fn a_taken_port_is_a_clear_error() {
        let b = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let e = bind(b.local_addr()).err().unwrap().to_string();
        assert!(
            e.contains("--metrics 127.0.0.1:") && e.contains("cannot listen"),
            "{e}"
        );
    }
}
