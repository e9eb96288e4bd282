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
use std::path::PathBuf;

use pcap_parser::{LegacyPcapBlock, Linktype, PcapHeader, ToVec};

fn usage() -> ! {
    eprintln!("usage: syn-flood --out FILE --count N [--rate SYN_PER_S] [--retries R]");
    std::process::exit(2);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut out: Option<PathBuf> = None;
    let mut count: Option<u64> = None;
    let mut rate = 100_000u64;
    let mut retries = 0u32;
    while let Some(a) = args.next() {
        let mut num = || args.next().and_then(|v| v.parse::<u64>().ok());
        match a.as_str() {
            "--out" => out = args.next().map(PathBuf::from),
            "--count" => count = Some(num().unwrap_or_else(|| usage())),
            "--rate" => rate = num().filter(|&r| r > 0).unwrap_or_else(|| usage()),
            "--retries" => retries = num().filter(|&r| r <= 8).unwrap_or_else(|| usage()) as u32,
            _ => usage(),
        }
    }
    let (Some(out), Some(count)) = (out, count) else {
        usage()
    };
    // 60,000 ports per source address, 131,072 addresses in 198.18.0.0/15
    if count == 0 || count > 60_000 * 131_072 {
        usage();
    }
    let tmp = out.with_extension("tmp");
    let file = std::fs::File::create(&tmp).unwrap_or_else(|e| {
        eprintln!("syn-flood: cannot create {}: {e}", tmp.display());
        std::process::exit(1)
    });
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut hdr = PcapHeader::new();
    hdr.network = Linktype::ETHERNET;
    hdr.snaplen = 65_535;
    w.write_all(&hdr.to_vec_raw().expect("header")).unwrap();
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
            w.write_all(&block.to_vec_raw().expect("record")).unwrap();
            frames += 1;
        }
    }
    w.flush().unwrap();
    drop(w);
    std::fs::rename(&tmp, &out).unwrap();
    eprintln!(
        "wrote {frames} SYNs ({count} connections) to {}",
        out.display()
    );
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
