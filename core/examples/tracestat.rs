//! Prints, per trace file, how many frames were read and how many decoded to TCP segments,
//! with the reasons for the rest, and a digest of every frame read (time, link type, lengths,
//! bytes, interface) to tell two builds' readers apart. A quick look at what the reader and
//! decoder make of a file.
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

fn main() {
    for path in std::env::args().skip(1) {
        let mut r = match mimic_core::trace::TraceReader::open(&path) {
            Ok(r) => r,
            Err(e) => {
                println!("{path}: OPEN ERROR {e}");
                continue;
            }
        };
        let mut tcp = 0u64;
        // SipHash with fixed keys: the same digest for the same frames with the same toolchain
        #[allow(deprecated)]
        let mut digest = std::hash::SipHasher::new();
        let mut reasons: BTreeMap<&'static str, u64> = BTreeMap::new();
        let end = loop {
            match r.next_frame() {
                Ok(Some(f)) => {
                    (
                        f.ts.as_nanos(),
                        f.link.to_u32(),
                        f.wire_len,
                        f.data,
                        f.interface,
                    )
                        .hash(&mut digest);
                    match mimic_core::packet::decode(f.link, f.data) {
                        Ok(_) => tcp += 1,
                        Err(e) => *reasons.entry(e.as_str()).or_default() += 1,
                    }
                }
                Ok(None) => break "eof".to_string(),
                Err(e) => break format!("ERROR {e}"),
            }
        };
        println!(
            "{path}: frames={} tcp={tcp} {:?} {:?} digest={:016x} end={end}",
            r.stats.frames,
            reasons,
            r.stats,
            digest.finish()
        );
    }
}
