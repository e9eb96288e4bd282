//! pcapng block encoding (draft-ietf-opsawg-pcapng): Section Header, Interface Description
//! with nanosecond `if_tsresol`, Enhanced Packet and Interface Statistics blocks, with the
//! options mimic records. Blocks are appended to a byte buffer in host byte order (the SHB's
//! byte-order magic tells readers which). Written by hand rather than with a crate so the
//! per-packet path appends into one reused buffer without allocating.

use mimic_core::Timestamp;

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const ISB: u32 = 0x0000_0005;
const EPB: u32 = 0x0000_0006;

const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

struct BlockBuilder<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
    has_options: bool,
}

impl<'a> BlockBuilder<'a> {
    fn new(buf: &'a mut Vec<u8>, block_type: u32) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&block_type.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in finish()
        BlockBuilder {
            buf,
            start,
            has_options: false,
        }
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn option(&mut self, code: u16, value: &[u8]) -> &mut Self {
        // option values are at most 65535 bytes; longer text is cut at a char boundary
        let mut value = value;
        if value.len() > 65_532 {
            value = &value[..65_532];
        }
        self.has_options = true;
        self.u16(code).u16(value.len() as u16);
        self.buf.extend_from_slice(value);
        self.buf
            .resize(self.buf.len() + pad4(value.len()) - value.len(), 0);
        self
    }
    fn option_str(&mut self, code: u16, s: &str) -> &mut Self {
        let mut end = s.len().min(65_532);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.option(code, &s.as_bytes()[..end])
    }
    /// pcapng timestamps are two u32 (high, low) of a 64-bit count of `if_tsresol` units.
    fn ts_option(&mut self, code: u16, ts: Timestamp) -> &mut Self {
        let t = ts.as_nanos().max(0) as u64;
        let mut v = [0u8; 8];
        v[..4].copy_from_slice(&((t >> 32) as u32).to_ne_bytes());
        v[4..].copy_from_slice(&(t as u32).to_ne_bytes());
        self.option(code, &v)
    }
    fn u64_option(&mut self, code: u16, v: u64) -> &mut Self {
        self.option(code, &v.to_ne_bytes())
    }
    fn finish(&mut self) {
        if self.has_options {
            self.u16(OPT_END).u16(0);
        }
        let total = (self.buf.len() - self.start + 4) as u32;
        self.u32(total);
        self.buf[self.start + 4..self.start + 8].copy_from_slice(&total.to_ne_bytes());
    }
}

/// Section header with the settings as comments.
pub fn section_header(buf: &mut Vec<u8>, user_appl: &str, os: &str, comments: &[String]) {
    let mut b = BlockBuilder::new(buf, SHB);
    b.u32(0x1A2B_3C4D).u16(1).u16(0).u64(u64::MAX); // magic, version 1.0, section length unknown
    for c in comments {
        b.option_str(OPT_COMMENT, c);
    }
    b.option_str(3, os).option_str(4, user_appl);
    b.finish();
}

/// Interface description with nanosecond timestamps.
pub fn interface_description(
    buf: &mut Vec<u8>,
    linktype: u32,
    snaplen: u32,
    name: &str,
    description: &str,
    filter: Option<&str>,
) {
    let mut b = BlockBuilder::new(buf, IDB);
    b.u16(linktype as u16).u16(0).u32(snaplen);
    if !name.is_empty() {
        b.option_str(2, name);
    }
    if !description.is_empty() {
        b.option_str(3, description);
    }
    b.option(9, &[9]); // if_tsresol: 10^-9
    if let Some(f) = filter {
        // if_filter: first byte 0 = a libpcap filter string
        let mut v = vec![0u8];
        v.extend_from_slice(f.as_bytes());
        b.option(11, &v);
    }
    b.finish();
}

/// One packet. `data` is what was kept, `wire_len` its length on the wire.
#[inline]
pub fn enhanced_packet(
    buf: &mut Vec<u8>,
    interface: u32,
    ts: Timestamp,
    wire_len: u32,
    data: &[u8],
) {
    let t = ts.as_nanos().max(0) as u64;
    let total = (28 + pad4(data.len()) + 4) as u32;
    buf.reserve(total as usize);
    for v in [
        EPB,
        total,
        interface,
        (t >> 32) as u32,
        t as u32,
        data.len() as u32,
        wire_len.max(data.len() as u32),
    ] {
        buf.extend_from_slice(&v.to_ne_bytes());
    }
    buf.extend_from_slice(data);
    buf.resize(buf.len() + pad4(data.len()) - data.len(), 0);
    buf.extend_from_slice(&total.to_ne_bytes());
}

/// Interface statistics (counters from the start of the capture).
#[derive(Clone, Copy, Debug, Default)]
pub struct IfStats {
    pub start: Timestamp,
    pub end: Timestamp,
    /// Packets the source received (isb_ifrecv).
    pub received: u64,
    /// Packets the NIC / kernel dropped before mimic saw them (isb_ifdrop).
    pub dropped: u64,
    /// Packets that passed sampling and policy (isb_filteraccept).
    pub accepted: u64,
    /// Packets mimic itself dropped after receiving them: disk full, queue overflow (isb_osdrop).
    pub os_dropped: u64,
    /// Packets written to files (isb_usrdeliv).
    pub delivered: u64,
}

pub fn interface_statistics(
    buf: &mut Vec<u8>,
    interface: u32,
    now: Timestamp,
    s: &IfStats,
    comment: &str,
) {
    let t = now.as_nanos().max(0) as u64;
    let mut b = BlockBuilder::new(buf, ISB);
    b.u32(interface).u32((t >> 32) as u32).u32(t as u32);
    if !comment.is_empty() {
        b.option_str(OPT_COMMENT, comment);
    }
    b.ts_option(2, s.start)
        .ts_option(3, s.end)
        .u64_option(4, s.received)
        .u64_option(5, s.dropped)
        .u64_option(6, s.accepted)
        .u64_option(7, s.os_dropped)
        .u64_option(8, s.delivered);
    b.finish();
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_parser::pcapng::Block;
    use pcap_parser::traits::PcapReaderIterator;
    use pcap_parser::PcapBlockOwned;

    #[test]
    fn blocks_parse_back() {
        let mut buf = Vec::new();
        section_header(
            &mut buf,
            "mimic test",
            "Linux",
            &["sampling 1/90".into(), "ünïcode ok".into()],
        );
        interface_description(&mut buf, 1, 128, "eth0", "test", Some("tcp port 80"));
        enhanced_packet(
            &mut buf,
            0,
            Timestamp::from_nanos(1_700_000_000_123_456_789),
            1514,
            &[1, 2, 3, 4, 5],
        );
        enhanced_packet(
            &mut buf,
            0,
            Timestamp::from_nanos(1_700_000_001_000_000_000),
            60,
            &[9; 60],
        );
        interface_statistics(
            &mut buf,
            0,
            Timestamp::from_nanos(1_700_000_002_000_000_000),
            &IfStats {
                received: 10,
                dropped: 2,
                ..Default::default()
            },
            "x",
        );
        let mut r = pcap_parser::pcapng::PcapNGReader::new(1 << 16, &buf[..]).unwrap();
        let mut kinds = 0usize;
        loop {
            match r.next() {
                Ok((n, PcapBlockOwned::NG(b))) => {
                    match &b {
                        Block::EnhancedPacket(e) if e.origlen == 1514 => {
                            assert_eq!(e.caplen, 5);
                            assert_eq!(&e.data[..5], &[1, 2, 3, 4, 5]);
                            let ts = ((e.ts_high as u64) << 32) | e.ts_low as u64;
                            assert_eq!(ts, 1_700_000_000_123_456_789);
                        }
                        Block::InterfaceDescription(i) => assert_eq!(i.if_tsresol, 9),
                        _ => {}
                    }
                    kinds += 1;
                    r.consume(n);
                }
                Ok(_) => panic!("legacy block"),
                Err(pcap_parser::PcapError::Eof) => break,
                Err(pcap_parser::PcapError::Incomplete(_)) => r.refill().unwrap(),
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(kinds, 5);
        // the core reader sees ns timestamps and the ISB drop count
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.pcapng");
        std::fs::write(&p, &buf).unwrap();
        let mut tr = mimic_core::trace::TraceReader::open(&p).unwrap();
        let f = tr.next_frame().unwrap().unwrap();
        assert_eq!(f.ts, Timestamp::from_nanos(1_700_000_000_123_456_789));
        assert_eq!(f.wire_len, 1514);
        assert!(tr.next_frame().unwrap().is_some());
        assert!(tr.next_frame().unwrap().is_none());
        assert_eq!(tr.stats.if_dropped, 2);
    }
}
