//! Builds a large many-connection trace for benchmarks by looping real captures.
//!
//! `gen-trace --out FILE --loops N TRACE...`: every Ethernet trace is replayed N times one
//! after another; loop k XORs the middle bytes of every IPv4/IPv6 address with k (a bijection,
//! so both directions of a connection stay paired and each loop's connections are distinct)
//! and shifts time so the output is in time order (gaps longer than one second are shortened
//! to one second). Checksums are left as they were (no peer in the benchmark verifies them).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use mimic_core::packet::LinkType;
use mimic_core::trace::TraceReader;
use pcap_parser::{LegacyPcapBlock, Linktype, PcapHeader, ToVec};

fn main() {
    let mut args = std::env::args().skip(1);
    let mut out: Option<PathBuf> = None;
    let mut loops = 1u32;
    let mut inputs = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = args.next().map(PathBuf::from),
            "--loops" => loops = args.next().and_then(|v| v.parse().ok()).expect("--loops N"),
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    let out = out.expect("--out FILE");
    if inputs.is_empty() || loops == 0 || loops > 65535 {
        eprintln!("usage: gen-trace --out FILE --loops N(1..65535) TRACE...");
        std::process::exit(2);
    }
    let mut w =
        BufWriter::with_capacity(1 << 20, std::fs::File::create(&out).expect("create output"));
    let mut hdr = PcapHeader::new();
    hdr.network = Linktype::ETHERNET;
    hdr.snaplen = 262_144;
    w.write_all(&hdr.to_vec_raw().expect("header")).unwrap();
    let mut clock: i64 = 1_600_000_000_000_000_000;
    let mut frames = 0u64;
    for k in 0..loops {
        for path in &inputs {
            let mut r = match TraceReader::open(path) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("skipping {e}");
                    continue;
                }
            };
            let mut prev: Option<i64> = None;
            while let Ok(Some(f)) = r.next_frame() {
                if f.link != LinkType::Ethernet {
                    continue;
                }
                let ts = f.ts.as_nanos();
                let step = prev.map_or(0, |p| (ts - p).clamp(0, 1_000_000_000));
                prev = Some(ts);
                clock += step;
                let mut data = f.data.to_vec();
                rewrite_addresses(&mut data, k as u16);
                let secs = clock / 1_000_000_000;
                let usec = (clock % 1_000_000_000) / 1_000;
                let block = LegacyPcapBlock {
                    ts_sec: secs as u32,
                    ts_usec: usec as u32,
                    caplen: data.len() as u32,
                    origlen: f.wire_len.max(data.len() as u32),
                    data: &data,
                };
                w.write_all(&block.to_vec_raw().expect("record")).unwrap();
                frames += 1;
            }
            clock += 1_000_000;
        }
    }
    w.flush().unwrap();
    eprintln!("wrote {} frames to {}", frames, out.display());
}

/// XORs bytes 1–2 of IPv4 addresses (2–3 of IPv6) with `k`, after any VLAN tags.
fn rewrite_addresses(f: &mut [u8], k: u16) {
    if k == 0 || f.len() < 14 {
        return;
    }
    let mut off = 12;
    let mut et = u16::from_be_bytes([f[off], f[off + 1]]);
    while (et == 0x8100 || et == 0x88a8) && f.len() >= off + 6 {
        off += 4;
        et = u16::from_be_bytes([f[off], f[off + 1]]);
    }
    let ip = off + 2;
    let [hi, lo] = k.to_be_bytes();
    match et {
        0x0800 if f.len() >= ip + 20 => {
            for a in [ip + 12, ip + 16] {
                f[a + 1] ^= hi;
                f[a + 2] ^= lo;
            }
        }
        0x86dd if f.len() >= ip + 40 => {
            for a in [ip + 8, ip + 24] {
                f[a + 2] ^= hi;
                f[a + 3] ^= lo;
            }
        }
        _ => {}
    }
}
