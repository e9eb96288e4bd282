//! Entry points for fuzzing (cargo-fuzz targets in `fuzz/`, and the deterministic smoke test
//! that runs in the normal test suite). Each must return, never panic or hang, for any input.

use mimic_core::packet::{decode, LinkType};
use mimic_core::trace::TraceReader;
use mimic_core::Timestamp;

use crate::analyzer::Analyzer;
use crate::config::Config;

const LINKS: [u32; 10] = [0, 1, 101, 108, 113, 276, 228, 229, 239, 147];

/// Decodes `data` as a frame of every supported link type.
pub fn decode_frame(data: &[u8]) {
    for l in LINKS {
        let _ = decode(LinkType::from_u32(l), data);
    }
}

/// Interprets `data` as a sequence of frames — `[link index][time step: u16][length: u16][bytes]`
/// — fed to one analyzer, then closes every connection and builds every record.
pub fn analyze_frames(data: &[u8]) {
    let cfg = Config {
        max_connections: 64,
        max_outstanding_segments: 64,
        max_exchanges: 64,
        ..Config::default()
    };
    let mut an = Analyzer::new(cfg);
    let mut rest = data;
    let mut t = 1_600_000_000_000_000_000i64;
    let mut no = 0;
    while rest.len() >= 5 {
        let link = LinkType::from_u32(LINKS[rest[0] as usize % LINKS.len()]);
        // steps of up to ~65 ms, sometimes backwards
        let step = i16::from_le_bytes([rest[1], rest[2]]) as i64 * 1_000;
        let len = (u16::from_le_bytes([rest[3], rest[4]]) as usize).min(rest.len() - 5);
        t += step;
        no += 1;
        let _ = an.handle_frame(no, Timestamp::from_nanos(t), link, &rest[5..5 + len]);
        while an.poll_record().is_some() {}
        rest = &rest[5 + len..];
    }
    an.finish();
    while an.poll_record().is_some() {}
}

/// Reads `data` as a trace file and analyzes every frame in it.
pub fn analyze_trace(data: &[u8]) {
    let Ok(mut r) = TraceReader::from_bytes("fuzz", data.to_vec()) else {
        return;
    };
    let mut an = Analyzer::new(Config::default());
    let mut no = 0;
    while let Ok(Some(f)) = r.next_frame() {
        no += 1;
        let _ = an.handle_frame(no, f.ts, f.link, f.data);
        while an.poll_record().is_some() {}
    }
    an.finish();
    while an.poll_record().is_some() {}
}
