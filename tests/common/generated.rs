//! The suite's own captures: stand-ins for the public corpus, written by `mimic_core::testcap`
//! from scripted TCP conversations when `../shared/traces/public` is absent.
//!
//! Each stand-in carries the corpus file's name and the property the tests read from it (a
//! link type, a byte order, VLAN tags, IPv6, a snap length, losses, 1000 requests on one
//! connection, a capture starting mid-flow, the addresses the anonymization test follows
//! across files, the delays of the latency captures, a file cut short, …); the folders hold
//! a smaller but varied set of the same kinds, plus malformed files made here and refused
//! connection attempts (SYN answered by RST).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mimic_core::testcap::{
    capture_bytes, write_frames, Capture, Close, Conn, Exchange, Format, Link,
};

const T0: i64 = 1_700_000_000_000_000_000;
const MS: i64 = 1_000_000;

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn pcap_le() -> Capture {
    Capture::default()
}

fn cap(format: Format, link: Link) -> Capture {
    Capture {
        format,
        link,
        snaplen: 262_144,
    }
}

const LE: Format = Format::Pcap {
    big_endian: false,
    nanos: false,
};
const BE: Format = Format::Pcap {
    big_endian: true,
    nanos: false,
};
const NG: Format = Format::Pcapng { nanos: false };

fn ether() -> Link {
    Link::Ethernet { vlans: Vec::new() }
}

/// A small deterministic generator for sizes and delays.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// `n` web connections from `client` to `servers` (round robin), keep-alive with 1–4 GETs each,
/// one every `every_ns`; every `loss_every`-th connection loses a response segment.
fn web(
    seed: u64,
    clients: &[&str],
    servers: &[&str],
    n: usize,
    every_ns: i64,
    loss_every: usize,
    close: Close,
) -> Vec<Conn> {
    let mut rng = Rng(seed | 1);
    (0..n)
        .map(|i| {
            let client: std::net::IpAddr = clients[i % clients.len()].parse().unwrap();
            let mut c = Conn::new(
                SocketAddr::new(client, 40_000 + i as u16),
                sa(servers[i % servers.len()]),
                T0 + i as i64 * every_ns + rng.next(1_000) as i64 * 1_000,
            );
            c.rtt_ns = (10 + rng.next(90) as i64) * MS;
            c.rate_bps = [1_000_000, 2_000_000, 10_000_000, 50_000_000][rng.next(4) as usize];
            for k in 0..1 + rng.next(4) {
                let think = if k == 0 {
                    0
                } else {
                    (rng.next(200) as i64) * MS
                };
                c.exchanges.push(Exchange::http_get(
                    &format!("/{i}/{k}"),
                    200 + rng.next(30_000) as usize,
                    think,
                    (1 + rng.next(30) as i64) * MS,
                ));
            }
            if loss_every > 0 && i % loss_every == loss_every - 1 {
                c.lose = vec![1 + rng.next(4) as usize];
            }
            c.close = close;
            c
        })
        .collect()
}

/// One connection with one GET, for the latency stand-ins.
fn latency(rtt_ms: i64, think_ms: i64, delay_ms: i64) -> Vec<Conn> {
    let mut c = Conn::new(sa("192.168.0.114:1137"), sa("74.125.95.104:80"), T0);
    c.rtt_ns = rtt_ms * MS;
    c.exchanges
        .push(Exchange::http_get("/", 5_000, think_ms * MS, delay_ms * MS));
    c.close = Close::None;
    vec![c]
}

/// A bulk download with losses (SACK recovery), for the byte-order pair.
fn bulk() -> Vec<Conn> {
    let mut c = Conn::new(sa("128.183.2.10:1052"), sa("192.20.239.3:5001"), T0);
    c.rtt_ns = 70 * MS;
    c.rate_bps = 4_000_000;
    c.exchanges.push(Exchange {
        think_ns: 0,
        request: b"send".to_vec(),
        server_delay_ns: MS,
        response: vec![0x55; 600_000],
        response_not_captured: false,
    });
    c.lose = vec![40, 41, 180, 333];
    vec![c]
}

/// Chargen (port 19) answering 132.235.3.132:57247, captured after the handshake.
fn chargen_midflow() -> Vec<Conn> {
    let mut c = Conn::new(sa("132.235.3.132:57247"), sa("132.235.1.2:19"), T0);
    c.handshake = false;
    c.rtt_ns = 5 * MS;
    c.exchanges.push(Exchange {
        think_ns: 0,
        request: Vec::new(),
        server_delay_ns: 0,
        response: (0..200_000).map(|i| b' ' + (i % 95) as u8).collect(),
        response_not_captured: false,
    });
    c.lose = vec![30];
    c.close = Close::None;
    vec![c]
}

/// 1000 GETs on one IPv6 keep-alive connection; the tap missed the 500th response.
fn thousand_requests() -> Vec<Conn> {
    let mut c = Conn::new(sa("[2001:db8::1]:51234"), sa("[2001:db8::2]:80"), T0);
    c.rtt_ns = MS / 5;
    c.rate_bps = 1_000_000_000;
    for k in 0..1000 {
        let mut e = Exchange::http_get(&format!("/{k}"), 100, 200_000, 100_000);
        e.response_not_captured = k == 499;
        c.exchanges.push(e);
    }
    vec![c]
}

/// 500 echo connections from one client, one every 13 ms.
fn echo() -> Vec<Conn> {
    (0..500)
        .map(|i| {
            let mut c = Conn::new(
                sa(&format!("10.10.0.1:{}", 30_000 + i)),
                sa("10.10.0.2:7"),
                T0 + i as i64 * 13 * MS,
            );
            c.rtt_ns = 100_000;
            c.rate_bps = 1_000_000_000;
            let data: Vec<u8> = (0..6_000).map(|k| (k * 7 + i) as u8).collect();
            c.exchanges.push(Exchange {
                think_ns: 50_000,
                request: data.clone(),
                server_delay_ns: 50_000,
                response: data,
                response_not_captured: false,
            });
            c
        })
        .collect()
}

/// Connections among the IPv4 and IPv6 addresses the anonymization test follows across files.
fn anon_v4(pairs: &[(&str, &str)], close: Close) -> Vec<Conn> {
    pairs
        .iter()
        .enumerate()
        .map(|(i, (c, s))| {
            let mut k = Conn::new(sa(c), sa(s), T0 + i as i64 * 300 * MS);
            k.exchanges
                .push(Exchange::http_get("/index.html", 3_000, 0, 2 * MS));
            k.close = close;
            k
        })
        .collect()
}

/// Refused connection attempts, as Ethernet frames: each SYN answered by the server's RST-ACK
/// (no listener), the client trying again 0.5 s later.
fn refused() -> Vec<(i64, Vec<u8>)> {
    use etherparse::PacketBuilder;
    let (client, server) = ([192, 168, 100, 5], [192, 168, 100, 7]);
    let (cmac, smac) = ([0x02, 0, 0, 0, 0, 0x01], [0x02, 0, 0, 0, 0, 0x02]);
    let mut frames = Vec::new();
    for (i, dport) in [8080u16, 8080, 8080, 9000].into_iter().enumerate() {
        let t = T0 + i as i64 * 500 * MS;
        let sport = 50_000 + i as u16;
        let isn = 1_000_000 * (i as u32 + 1);
        let mut syn = Vec::new();
        PacketBuilder::ethernet2(cmac, smac)
            .ipv4(client, server, 64)
            .tcp(sport, dport, isn, 64_240)
            .syn()
            .write(&mut syn, &[])
            .unwrap();
        let mut rst = Vec::new();
        PacketBuilder::ethernet2(smac, cmac)
            .ipv4(server, client, 64)
            .tcp(dport, sport, 0, 0)
            .rst()
            .ack(isn.wrapping_add(1))
            .write(&mut rst, &[])
            .unwrap();
        frames.push((t, syn));
        frames.push((t + 150_000, rst));
    }
    frames
}

/// Every stand-in: its path under the corpus root, its format, and its connections.
fn stand_ins() -> Vec<(&'static str, Capture, Vec<Conn>)> {
    let bro_servers = ["192.150.187.43:80", "141.142.228.5:80"];
    let v6_pair = [
        ("[2001:618:400::5199:cc70]:1038", "[2001:618:1:8000::5]:80"),
        ("[2001:618:400::5199:cc70]:1039", "[2001:618:1:8000::5]:80"),
    ];
    let mut raw_v6 = anon_v4(&v6_pair, Close::Fin);
    raw_v6.extend(anon_v4(
        &[
            ("[2001:618:400::5199:cc70]:1040", "[2001:618:1:8000::5]:80"),
            ("[2001:618:400::5199:cc70]:1041", "[2001:618:1:8000::5]:80"),
        ],
        Close::Fin,
    ));
    let mut raw_mixed = anon_v4(
        &[
            (
                "[2001:638:902:1:202:b3ff:feee:5dc2]:2000",
                "[2001:618:1:8000::5]:80",
            ),
            ("[2001:618:400::5199:cc70]:2001", "[2001:618:1:8000::5]:443"),
        ],
        Close::Fin,
    );
    raw_mixed.extend(anon_v4(&[("10.0.0.9:3000", "10.0.1.1:80")], Close::Fin));
    let mut tcpreplay = web(
        5,
        &["192.168.0.20"],
        &["10.20.30.40:80"],
        5,
        200 * MS,
        0,
        Close::Fin,
    );
    tcpreplay.extend(anon_v4(
        &[("[2001:db8:5::1]:4000", "[2001:db8:6::1]:80")],
        Close::Fin,
    ));
    let mut rst = web(
        9,
        &["172.16.0.5"],
        &["172.16.1.1:80"],
        4,
        100 * MS,
        0,
        Close::Rst,
    );
    rst.extend(web(
        10,
        &["172.16.0.6"],
        &["172.16.1.1:80"],
        2,
        100 * MS,
        0,
        Close::None,
    ));
    let mut missing_syn = web(11, &["10.3.0.1"], &["10.3.0.2:80"], 1, 0, 0, Close::Fin);
    missing_syn[0].handshake = false;
    let ns = |big_endian| Format::Pcap {
        big_endian,
        nanos: true,
    };
    vec![
        // web/
        (
            "web/zeek_http_bro.org.pcap",
            pcap_le(),
            web(1, &["10.0.2.15"], &bro_servers, 20, 800 * MS, 6, Close::Fin),
        ),
        ("web/zeek_echo-connections.pcap", pcap_le(), echo()),
        ("web/tcpreplay_test.pcap", pcap_le(), tcpreplay),
        (
            "web/pcapplusplus_example.pcap",
            pcap_le(),
            web(
                2,
                &["192.168.1.100"],
                &["93.184.216.34:80", "151.101.1.69:80", "104.16.0.1:80"],
                60,
                250 * MS,
                4,
                Close::Fin,
            ),
        ),
        (
            "web/tcptrace_http.dmp.pcap",
            cap(BE, ether()),
            web(
                3,
                &["132.235.3.200", "132.235.3.201"],
                &["128.146.1.7:80", "131.187.1.1:80"],
                50,
                300 * MS,
                7,
                Close::Fin,
            ),
        ),
        (
            "web/chrissanders_http_espn.pcapng",
            cap(NG, ether()),
            web(
                4,
                &["172.16.16.128"],
                &["199.181.132.250:80"],
                25,
                20 * MS,
                0,
                Close::None,
            ),
        ),
        // loss/
        (
            "loss/chrissanders_latency1.pcapng",
            cap(NG, ether()),
            latency(30, 0, 20),
        ),
        (
            "loss/chrissanders_latency2.pcapng",
            cap(NG, ether()),
            latency(880, 0, 20),
        ),
        (
            "loss/chrissanders_latency3.pcapng",
            cap(NG, ether()),
            latency(30, 1350, 20),
        ),
        (
            "loss/chrissanders_latency4.pcapng",
            cap(NG, ether()),
            latency(30, 0, 1000),
        ),
        (
            "loss/tcptrace_dsack.dmp.pcap",
            Capture {
                snaplen: 200,
                ..pcap_le()
            },
            bulk(),
        ),
        (
            "loss/tcptrace_urgent.dmp.pcap",
            cap(BE, ether()),
            chargen_midflow(),
        ),
        (
            "loss/generated_losses.pcap",
            pcap_le(),
            web(
                6,
                &["10.7.0.1", "10.7.0.2"],
                &["10.8.0.1:80"],
                100,
                50 * MS,
                2,
                Close::Fin,
            ),
        ),
        // encap/
        (
            "encap/pcapplusplus_sll.pcap",
            cap(LE, Link::LinuxSll),
            web(
                12,
                &["10.4.0.1"],
                &["10.4.0.2:80"],
                3,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        (
            "encap/tcptrace_dlt_null.dmp.pcap",
            cap(BE, Link::Null),
            web(
                13,
                &["127.0.0.1"],
                &["127.0.0.2:8080"],
                3,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        (
            "encap/pcapplusplus_raw_ip.pcap",
            cap(LE, Link::RawIp),
            raw_mixed,
        ),
        (
            "encap/pcapplusplus_four_ipv6_http_streams_rawip.pcap",
            cap(LE, Link::RawIp),
            raw_v6,
        ),
        (
            "encap/arkime_v6-http.pcap",
            pcap_le(),
            anon_v4(
                &[("[2001:db8:1::10]:5000", "[2001:db8:2::80]:80")],
                Close::Fin,
            ),
        ),
        (
            "encap/zeek_http-qinq-0.pcap",
            cap(
                LE,
                Link::Ethernet {
                    vlans: vec![100, 200],
                },
            ),
            web(
                14,
                &["10.5.0.1"],
                &["10.5.0.2:80"],
                3,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        (
            "encap/zeek_nflog-http.pcap",
            cap(LE, Link::Nflog),
            web(
                15,
                &["10.6.0.1"],
                &["10.6.0.2:80"],
                2,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        // format/
        (
            "format/tcptrace_sack_nasa_sim.dump.bigendian.pcap",
            Capture {
                snaplen: 200,
                ..cap(BE, ether())
            },
            bulk(),
        ),
        (
            "format/generated_nanosecond_be.pcap",
            cap(ns(true), ether()),
            web(
                16,
                &["10.9.0.1"],
                &["10.9.0.2:80"],
                4,
                100 * MS,
                2,
                Close::Fin,
            ),
        ),
        (
            "format/generated_nanosecond.pcapng",
            cap(Format::Pcapng { nanos: true }, ether()),
            web(
                17,
                &["10.9.1.1"],
                &["10.9.1.2:80"],
                4,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        (
            "format/generated_snaplen68.pcap",
            Capture {
                snaplen: 68,
                ..pcap_le()
            },
            web(
                18,
                &["10.9.2.1"],
                &["10.9.2.2:80"],
                4,
                100 * MS,
                2,
                Close::Fin,
            ),
        ),
        (
            "format/generated_vlan.pcapng",
            cap(NG, Link::Ethernet { vlans: vec![7] }),
            web(
                19,
                &["10.9.3.1"],
                &["10.9.3.2:80"],
                4,
                100 * MS,
                0,
                Close::Fin,
            ),
        ),
        // edge/
        (
            "edge/zeek_http_1000-requests-one-dropped-response_ipv6.pcap",
            pcap_le(),
            thousand_requests(),
        ),
        (
            "edge/zeek_http_get-without-fins.pcap",
            pcap_le(),
            anon_v4(
                &[
                    ("10.0.0.1:1001", "192.150.187.43:80"),
                    ("10.0.0.138:1002", "141.142.228.5:80"),
                ],
                Close::None,
            ),
        ),
        (
            "edge/zeek_tcp_handshake-reorder.pcap",
            pcap_le(),
            anon_v4(
                &[
                    ("10.0.0.1:1003", "141.142.228.5:80"),
                    ("10.0.0.1:1004", "192.150.187.43:80"),
                ],
                Close::Fin,
            ),
        ),
        ("edge/zeek_tcp_missing-syn.pcap", pcap_le(), missing_syn),
        ("edge/generated_rst-and-open.pcap", pcap_le(), rst),
    ]
}

/// Malformed files: cut records, impossible lengths, broken headers, not a capture at all.
fn malformed(root: &Path) {
    let dir = root.join("malformed");
    std::fs::create_dir_all(&dir).unwrap();
    let conns = web(
        20,
        &["10.11.0.1"],
        &["10.11.0.2:80"],
        2,
        100 * MS,
        0,
        Close::Fin,
    );
    let good = capture_bytes(&pcap_le(), &conns);
    let ns_null = capture_bytes(
        &cap(
            Format::Pcap {
                big_endian: false,
                nanos: true,
            },
            Link::Null,
        ),
        &conns,
    );
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    // a nanosecond pcap cut in its second record (the stand-in for ndpi_fuzz-2021-10-13)
    let first_rec = 24 + 16 + u32::from_le_bytes(ns_null[32..36].try_into().unwrap()) as usize;
    files.push((
        "ndpi_fuzz-2021-10-13.pcap",
        ns_null[..first_rec + 16 + 10].to_vec(),
    ));
    files.push((
        "cut-in-a-record-header.pcap",
        good[..good.len() / 2 + 5].to_vec(),
    ));
    // a record claiming 4 GiB
    let mut huge = good[..24].to_vec();
    huge.extend_from_slice(&[
        0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ]);
    huge.extend_from_slice(&[0u8; 64]);
    files.push(("record-of-4-gib.pcap", huge));
    files.push(("not-a-capture.pcap", b"GET / HTTP/1.1\r\n\r\n".to_vec()));
    files.push(("empty.pcap", Vec::new()));
    files.push(("header-cut.pcap", good[..13].to_vec()));
    // frames cut inside their headers by a tiny snap length
    for (name, snap) in [
        ("snaplen-20.pcap", 20u32),
        ("snaplen-40.pcap", 40),
        ("snaplen-10.pcap", 10),
    ] {
        files.push((
            name,
            capture_bytes(
                &Capture {
                    snaplen: snap,
                    ..pcap_le()
                },
                &conns,
            ),
        ));
    }
    // IPv4 total length beyond the frame, and a TCP data offset beyond it
    let p = conns[0].packets();
    let mut frame = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    frame.extend_from_slice(&p[0].ip);
    let mut bad_len = frame.clone();
    bad_len[14 + 2] = 0x40;
    let mut bad_off = frame.clone();
    bad_off[14 + 20 + 12] = 0xf0;
    let mut not_ip = frame.clone();
    not_ip[14] = 0x00;
    files.push((
        "ipv4-total-length-beyond-frame.pcap",
        write_frames(&pcap_le(), &[(T0, bad_len)]),
    ));
    files.push((
        "tcp-data-offset-beyond-frame.pcap",
        write_frames(&pcap_le(), &[(T0, bad_off)]),
    ));
    files.push((
        "ip-version-0.pcap",
        write_frames(&pcap_le(), &[(T0, not_ip)]),
    ));
    // a pcapng block whose length runs past the end of the file
    let mut ng = capture_bytes(&cap(NG, ether()), &conns);
    let le32 = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let shb = le32(&ng, 4);
    let epb = shb + le32(&ng, shb + 4);
    ng[epb + 4..epb + 8].copy_from_slice(&0x00ff_fff0u32.to_le_bytes());
    files.push(("pcapng-block-past-the-end.pcapng", ng));
    for (name, bytes) in files {
        write_atomic(&dir.join(name), &bytes);
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let tmp = path.with_extension(format!("part-{}", std::process::id()));
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Writes the whole generated corpus under `root` (each file atomically, so test processes
/// running at once never see half a file).
pub fn write_all(root: &Path) {
    for (rel, cap, conns) in stand_ins() {
        write_atomic(&root.join(rel), &capture_bytes(&cap, &conns));
    }
    write_atomic(
        &root.join("edge/chrissanders_tcp_refuseconnection.pcapng"),
        &write_frames(&cap(NG, ether()), &refused()),
    );
    malformed(root);
}

/// The generated corpus's root (written once per test process).
pub fn root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("generated-traces");
        write_all(&root);
        root
    })
    .clone()
}
