//! `--metrics` of `mimic serve` on loopback (no root): the endpoint answers while the server
//! runs, parses with the Prometheus project's OpenMetrics parser, counts what was served, and
//! agrees with the statistics the server prints at exit.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use mimic_replay::preamble::{self, After, Preamble};

use crate::common::mimic;
use crate::prom::{scrape, wait_for};

/// Two distinct free loopback ports: both listeners are held until both ports are known (a
/// port just released is handed out again by the next bind about once in 7,000).
fn two_free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

/// Kills the child on drop (a failed test leaves no server behind).
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One request of `req` bytes (preamble included) answered by `resp` bytes and a FIN.
fn exchange(addr: SocketAddr, id: u64, req: u64, resp: u64) {
    let p = Preamble {
        conn_id: id,
        seq: 0,
        after: After::Fin,
        req_bytes: req,
        resp_bytes: resp,
        header_bytes: resp / 4,
        response_delay_us: 0,
        query_delay_us: 0,
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&p.encode()).unwrap();
    s.write_all(&vec![b'q'; (req - preamble::LEN as u64) as usize])
        .unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got.len() as u64, resp);
}

fn http(addr: SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serve_metrics_count_what_was_served_and_match_the_exit_statistics() {
    let (p_listen, p_metrics) = two_free_ports();
    let listen: SocketAddr = format!("127.0.0.1:{p_listen}").parse().unwrap();
    let maddr: SocketAddr = format!("127.0.0.1:{p_metrics}").parse().unwrap();
    let url = format!("http://{maddr}/metrics");
    let child = mimic()
        .args(["serve", "--json", "--listen"])
        .arg(listen.to_string())
        .arg("--metrics")
        .arg(maddr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = Running(Some(child));
    let first = wait_for(&[], &url, 20);
    assert_eq!(first.get("mimic_serve_connections_total"), 0);
    assert_eq!(first.types["mimic_serve_connections"], "counter");
    assert_eq!(first.types["mimic_serve_active_connections"], "gauge");

    // wait for the replay port too (the metrics port is bound first)
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(listen).is_err() {
        assert!(
            Instant::now() < deadline,
            "serve did not listen on {listen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in 0..3 {
        exchange(listen, i, 152, 1000);
    }
    // a connection that does not start with a preamble
    {
        let mut s = TcpStream::connect(listen).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&[b'x'; preamble::LEN]).unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    // the server counts a connection when it has finished with it: wait for the last one
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&[], &url);
        if m.get("mimic_serve_connection_errors_total{cause=\"bad_preamble\"}") == 1 {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "bad preamble never counted: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // three exchanges, the bad preamble, and the readiness probe's empty connection
    assert_eq!(m.get("mimic_serve_connections_total"), 5);
    assert_eq!(m.get("mimic_serve_requests_total"), 3);
    assert_eq!(m.get("mimic_serve_response_bytes_total"), 3000);
    assert_eq!(m.get("mimic_serve_request_bytes_total"), 3 * 152);
    assert_eq!(m.get("mimic_serve_active_connections"), 0);
    assert_eq!(
        m.get("mimic_serve_connection_errors_total{cause=\"io\"}"),
        0
    );

    // anything but /metrics is 404
    let r = http(maddr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 404 "), "{r}");

    // the exit statistics are the same numbers
    let mut c = run.0.take().unwrap();
    // SAFETY: signalling the child we spawned.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (k, metric) in [
        ("connections", "mimic_serve_connections_total"),
        ("exchanges", "mimic_serve_requests_total"),
        ("bytes_out", "mimic_serve_response_bytes_total"),
        ("bytes_in", "mimic_serve_request_bytes_total"),
        (
            "bad_preamble",
            "mimic_serve_connection_errors_total{cause=\"bad_preamble\"}",
        ),
    ] {
        assert_eq!(j[k].as_u64().unwrap(), m.get(metric), "{k}: {j}");
    }
}

#[test]
fn a_taken_metrics_port_is_a_clear_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let o = mimic()
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics"])
        .arg(addr.to_string())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("--metrics {addr}")) && err.contains("cannot listen"),
        "{err}"
    );
}

/// `serve --metrics` on the replay port is named as such (the metrics took the port, then
/// serving failed with "address already in use" after "metrics at ..." was printed).
#[test]
fn serve_metrics_on_the_replay_port_is_refused() {
    for (listen, metrics) in [
        ("127.0.0.1:18481", "127.0.0.1:18481"),
        ("0.0.0.0:18481", "127.0.0.1:18481"),
    ] {
        let o = crate::common::run(&["serve", "--listen", listen, "--metrics", metrics]);
        crate::common::assert_refused(&o, "--metrics and --listen both name port 18481");
    }
}
