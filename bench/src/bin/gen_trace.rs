//! Builds a large many-connection trace for benchmarks by looping real captures.
//!
//! `gen-trace --out FILE --loops N TRACE...`: every Ethernet trace is replayed N times one
//! after another; loop k XORs the middle bytes of every IPv4/IPv6 address with k (a bijection,
//! so both directions of a connection stay paired and each loop's connections are distinct)
//! and shifts time so the output is in time order (gaps longer than one second are shortened
//! to one second). Checksums are left as they were (no peer in the benchmark verifies them).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use mimic_core::packet::LinkType;
use mimic_core::trace::TraceReader;
use pcap_parser::{LegacyPcapBlock, Linktype, PcapHeader, ToVec};

/// Builds a large many-connection benchmark trace by looping real captures (Ethernet frames
/// only; every loop's addresses rewritten so its connections are distinct).
#[derive(Parser)]
#[command(name = "gen-trace")]
struct Args {
    /// The pcap file to write (replaced atomically: written beside it, then renamed)
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// How many times each trace is replayed
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=65535))]
    loops: u32,
    /// The captures to loop (pcap or pcapng; a file that cannot be read is skipped and named)
    #[arg(required = true, value_name = "TRACE")]
    traces: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let tmp = args.out.with_extension("pcap.tmp");
    match write(&args, &tmp) {
        Ok(frames) => {
            if let Err(e) = std::fs::rename(&tmp, &args.out) {
                let _ = std::fs::remove_file(&tmp);
                eprintln!(
                    "gen-trace: cannot rename {} to {}: {e}",
                    tmp.display(),
                    args.out.display()
                );
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {frames} frames to {}", args.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            eprintln!("gen-trace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the looped trace to `tmp`; the number of frames written.
fn write(args: &Args, tmp: &Path) -> Result<u64, String> {
    let io = |e: std::io::Error| format!("writing {}: {e}", tmp.display());
    let file = std::fs::File::create(tmp).map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut hdr = PcapHeader::new();
    hdr.network = Linktype::ETHERNET;
    hdr.snaplen = 262_144;
    w.write_all(&hdr.to_vec_raw().expect("a pcap header serializes"))
        .map_err(io)?;
    let mut clock: i64 = 1_600_000_000_000_000_000;
    let mut frames = 0u64;
    let mut readable = 0usize;
    for k in 0..args.loops {
        for path in &args.traces {
            let mut r = match TraceReader::open(path) {
                Ok(r) => r,
                Err(e) => {
                    if k == 0 {
                        eprintln!("gen-trace: skipping {e}");
                    }
                    continue;
                }
            };
            readable += usize::from(k == 0);
            let mut prev: Option<i64> = None;
            loop {
                let f = match r.next_frame() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        if k == 0 {
                            eprintln!("gen-trace: {}: the rest skipped: {e}", path.display());
                        }
                        break;
                    }
                };
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
                w.write_all(&block.to_vec_raw().expect("a pcap record serializes"))
                    .map_err(io)?;
                frames += 1;
            }
            clock += 1_000_000;
        }
    }
    if readable == 0 {
        return Err("none of the traces could be read".into());
    }
    w.flush().map_err(io)?;
    Ok(frames)
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
