//! Writes a hostile trace for the analyzer's memory bound: a SYN scan that nobody answers.
//!
//! `syn-flood --out FILE --count N [--rate SYN_PER_S] [--retries R]`: N connection attempts,
//! each a SYN (MSS, SACK-permitted, timestamps, window scale: a Linux client's options) from a
//! distinct source (address, port) in 198.18.0.0/15 to 198.19.255.1:80, evenly spaced at
//! `--rate` (100,000/s by default, so 3 M SYNs span 30 s: no idle timeout closes any of them
//! and the table fills and evicts). `--retries R` sends every SYN R more times (same ISN, new
//! IPv4 id, 1 s apart), as a client whose SYNs go unanswered does. Ethernet, classic pcap,
//! valid IPv4 and TCP checksums.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::Parser;
use pcap_parser::{LegacyPcapBlock, Linktype, PcapHeader, ToVec};

/// Writes a SYN scan nobody answers (one attempt per distinct source) for the analyzer's
/// memory bound.
#[derive(Parser)]
#[command(name = "syn-flood")]
struct Args {
    /// The pcap file to write (written beside it, then renamed)
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Connection attempts (distinct sources; at most 60,000 ports x 131,072 addresses)
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=60_000 * 131_072))]
    count: u64,
    /// SYNs per second
    #[arg(long, value_name = "SYN_PER_S", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    rate: u64,
    /// Resend every SYN this many more times, 1 s apart
    #[arg(long, value_name = "R", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=8))]
    retries: u32,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let tmp = args.out.with_extension("pcap.tmp");
    let res = write(&args, &tmp)
        .map_err(|e| format!("writing {}: {e}", tmp.display()))
        .and_then(|frames| {
            std::fs::rename(&tmp, &args.out)
                .map(|()| frames)
                .map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), args.out.display()))
        });
    match res {
        Ok(frames) => {
            eprintln!(
                "wrote {frames} SYNs ({} connections) to {}",
                args.count,
                args.out.display()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            eprintln!("syn-flood: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes the scan to `tmp`; the number of frames written.
fn write(
    &Args {
        count,
        rate,
        retries,
        ..
    }: &Args,
    tmp: &Path,
) -> std::io::Result<u64> {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(tmp)?);
    let mut hdr = PcapHeader::new();
    hdr.network = Linktype::ETHERNET;
    hdr.snaplen = 65_535;
    w.write_all(&hdr.to_vec_raw().expect("a pcap header serializes"))?;
    let start: i64 = 1_700_000_000_000_000_000;
    let gap = 1_000_000_000 / rate as i64;
    let mut frame = [0u8; 74];
    let mut frames = 0u64;
    // the retransmissions of SYN i go out 1 s, 2 s, ... after it: interleave them in time order
    // by emitting, at each step, the attempts whose send time has come
    let retry_lag = (1_000_000_000 / gap.max(1)) as u64; // SYNs per second
    let total = count + retries as u64 * retry_lag;
    for step in 0..total {
        for r in (0..=retries).rev() {
            let Some(i) = step.checked_sub(r as u64 * retry_lag) else {
                continue;
            };
            if i >= count {
                continue;
            }
            let t = start + step as i64 * gap;
            syn(&mut frame, i, r);
            let block = LegacyPcapBlock {
                ts_sec: (t / 1_000_000_000) as u32,
                ts_usec: ((t % 1_000_000_000) / 1_000) as u32,
                caplen: frame.len() as u32,
                origlen: frame.len() as u32,
                data: &frame,
            };
            w.write_all(&block.to_vec_raw().expect("a pcap record serializes"))?;
            frames += 1;
        }
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(frames)
}

/// Fills `f` with SYN number `i` (its `r`-th retransmission).
fn syn(f: &mut [u8; 74], i: u64, r: u32) {
    let src = 0xc612_0000u32 + (i / 60_000) as u32; // 198.18.0.0 + k
    let sport = 1024 + (i % 60_000) as u16;
    let dst = 0xc613_ff01u32; // 198.19.255.1
    let isn = (i as u32).wrapping_mul(2_654_435_761);
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&60u16.to_be_bytes());
    ip[4..6].copy_from_slice(&((i as u16).wrapping_add(r as u16 * 7919)).to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64;
    ip[9] = 6;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src.to_be_bytes());
    ip[16..20].copy_from_slice(&dst.to_be_bytes());
    let c = checksum(0, ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[34..74];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&isn.to_be_bytes());
    tcp[8..12].copy_from_slice(&[0; 4]);
    tcp[12] = 10 << 4; // 40-byte header
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    tcp[16..20].copy_from_slice(&[0; 4]);
    // MSS 1460, SACK permitted, timestamps, NOP, window scale 7
    let tsval = (i as u32).wrapping_add(r * 1000);
    tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
    tcp[24..26].copy_from_slice(&[4, 2]);
    tcp[26..28].copy_from_slice(&[8, 10]);
    tcp[28..32].copy_from_slice(&tsval.to_be_bytes());
    tcp[32..36].copy_from_slice(&[0; 4]);
    tcp[36..40].copy_from_slice(&[1, 3, 3, 7]);
    // pseudo-header: addresses, protocol, TCP length
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.to_be_bytes());
    pseudo[4..8].copy_from_slice(&dst.to_be_bytes());
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&40u16.to_be_bytes());
    let c = checksum(sum(0, &pseudo), tcp);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

fn sum(mut acc: u32, b: &[u8]) -> u32 {
    for w in b.chunks(2) {
        acc += u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32;
    }
    acc
}

/// The Internet checksum of `b`, continuing the partial sum `acc`.
fn checksum(acc: u32, b: &[u8]) -> u16 {
    let mut s = sum(acc, b);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}
