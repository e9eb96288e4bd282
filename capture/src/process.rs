//! The per-packet pipeline every source feeds: decode, sample the connection, cut to the
//! payload policy, anonymize. Pure: bytes in, bytes (or a reason) out, counters kept.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mimic_core::packet::decode;
use mimic_core::{DecodeError, LinkType, VlanStack};

use crate::anon::Anonymizer;
use crate::key::CaptureKey;
use crate::layers::locate;
use crate::sample::{Rate, Rule, Sampler};

/// What to do with frames that are not TCP (ARP, UDP, ICMP, IP fragments, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonTcp {
    /// Drop and count them (default: analysis needs only TCP).
    Drop,
    /// Keep IP ones, sampled by their own 5-tuple and cut to the transport header (plus the
    /// payload policy when not anonymizing); keep non-IP frames only when not anonymizing.
    Keep,
}

/// How much of each kept TCP segment to keep beyond its headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadPolicy {
    /// The first K payload bytes (0 = headers only).
    Bytes(u32),
    /// Everything that was captured.
    All,
}

impl PayloadPolicy {
    fn limit(self) -> usize {
        match self {
            PayloadPolicy::Bytes(k) => k as usize,
            PayloadPolicy::All => usize::MAX,
        }
    }
    pub fn describe(self) -> String {
        match self {
            PayloadPolicy::Bytes(0) => "headers only".into(),
            PayloadPolicy::Bytes(k) => format!("headers + first {k} payload bytes"),
            PayloadPolicy::All => "full payload".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub rate: Rate,
    pub rule: Rule,
    pub payload: PayloadPolicy,
    pub non_tcp: NonTcp,
    pub anonymize: bool,
}

impl Settings {
    /// Bytes of each frame a live source needs to capture for this policy: enough for the
    /// deepest headers mimic decodes (link + VLAN/MPLS + IPv6 with extension headers + TCP
    /// with options) plus the payload kept.
    pub fn source_snaplen(&self) -> u32 {
        match self.payload {
            PayloadPolicy::Bytes(k) => (320u32).saturating_add(k).min(262_144),
            PayloadPolicy::All => 262_144,
        }
    }
}

/// Counters of one processor (summed over workers for reporting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    pub received: u64,
    pub received_bytes: u64,
    pub kept: u64,
    pub kept_bytes: u64,
    pub sampled_out: u64,
    pub non_tcp_dropped: u64,
    /// Frames that look like TCP (or IP) but could not be decoded, dropped.
    pub malformed: u64,
    /// Frames whose addresses could not be located for anonymization, dropped.
    pub unanonymizable: u64,
    /// Connection openings (TCP SYN without ACK; a retransmitted SYN counts again) kept and
    /// sampled out.
    pub connections_kept: u64,
    pub connections_sampled_out: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.received += o.received;
        self.received_bytes += o.received_bytes;
        self.kept += o.kept;
        self.kept_bytes += o.kept_bytes;
        self.sampled_out += o.sampled_out;
        self.non_tcp_dropped += o.non_tcp_dropped;
        self.malformed += o.malformed;
        self.unanonymizable += o.unanonymizable;
        self.connections_kept += o.connections_kept;
        self.connections_sampled_out += o.connections_sampled_out;
    }
}

/// Outcome for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Appended this many bytes to the output buffer.
    Keep(usize),
    SampledOut,
    NonTcpDropped,
    Malformed(DecodeError),
    Unanonymizable,
}

pub struct Processor {
    settings: Settings,
    sampler: Sampler,
    anon: Option<Anonymizer>,
    pub counters: Counters,
}

fn ip_of(b: &[u8], v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).expect("16")))
    } else {
        IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[..4]).expect("4")))
    }
}

impl Processor {
    pub fn new(settings: Settings, key: &CaptureKey) -> Processor {
        let sampler = Sampler::new(settings.rate, settings.rule.clone(), key.sampling());
        let anon = settings
            .anonymize
            .then(|| Anonymizer::new(&key.cryptopan(), key.mac()));
        Processor {
            settings,
            sampler,
            anon,
            counters: Counters::default(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Processes one frame of `wire_len` bytes on the wire; a kept frame's bytes are appended
    /// to `out`.
    pub fn process(
        &mut self,
        link: LinkType,
        data: &[u8],
        wire_len: u32,
        out: &mut Vec<u8>,
    ) -> Verdict {
        self.counters.received += 1;
        self.counters.received_bytes += wire_len as u64;
        let v = self.classify(link, data, out);
        match v {
            Verdict::Keep(n) => {
                self.counters.kept += 1;
                self.counters.kept_bytes += n as u64;
            }
            Verdict::SampledOut => self.counters.sampled_out += 1,
            Verdict::NonTcpDropped => self.counters.non_tcp_dropped += 1,
            Verdict::Malformed(_) => self.counters.malformed += 1,
            Verdict::Unanonymizable => self.counters.unanonymizable += 1,
        }
        v
    }

    fn classify(&mut self, link: LinkType, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        let mut opening = false;
        let cut = match decode(link, data) {
            Ok(seg) => {
                opening = seg.flags.syn() && !seg.flags.ack();
                if !self
                    .sampler
                    .keep(seg.vlan, 6, (seg.src, seg.sport), (seg.dst, seg.dport))
                {
                    self.counters.connections_sampled_out += opening as u64;
                    return Verdict::SampledOut;
                }
                // decode() hands back the captured payload as a subslice of `data`
                let payload_off = seg.payload.as_ptr() as usize - data.as_ptr() as usize;
                payload_off + seg.payload.len().min(self.settings.payload.limit())
            }
            Err(e)
                if e.is_benign()
                    || e == DecodeError::IpFragment
                    || e == DecodeError::UnsupportedLinkType =>
            {
                if self.settings.non_tcp == NonTcp::Drop {
                    return Verdict::NonTcpDropped;
                }
                match self.non_tcp_cut(link, data) {
                    Ok(c) => c,
                    Err(v) => return v,
                }
            }
            Err(e) => return Verdict::Malformed(e),
        };
        let cut = cut.min(data.len());
        let start = out.len();
        out.extend_from_slice(&data[..cut]);
        if let Some(anon) = &mut self.anon {
            if !anon.rewrite(link, &mut out[start..]) {
                out.truncate(start);
                return Verdict::Unanonymizable;
            }
        }
        self.counters.connections_kept += opening as u64;
        Verdict::Keep(cut)
    }

    /// Cut point of a kept non-TCP frame, or why it is not kept.
    fn non_tcp_cut(&self, link: LinkType, data: &[u8]) -> Result<usize, Verdict> {
        let layers = locate(link, data);
        let Some(ip) = layers.ip else {
            if self.anon.is_some() {
                // ARP and friends carry addresses we do not rewrite
                return Err(Verdict::Unanonymizable);
            }
            return Ok(128usize.saturating_add(self.settings.payload.limit()));
        };
        let (alen, aoff) = if ip.v6 {
            (16, ip.off + 8)
        } else {
            (4, ip.off + 12)
        };
        let src = ip_of(&data[aoff..], ip.v6);
        let dst = ip_of(&data[aoff + alen..], ip.v6);
        let ports = |o: usize| -> (u16, u16) {
            match (data.get(o..o + 4), ip.proto) {
                (Some(p), 17 | 132 | 136) => (
                    u16::from_be_bytes([p[0], p[1]]),
                    u16::from_be_bytes([p[2], p[3]]),
                ),
                _ => (0, 0),
            }
        };
        let (sp, dp) = ip.l4().map_or((0, 0), ports);
        if !self
            .sampler
            .keep(VlanStack::NONE, ip.proto, (src, sp), (dst, dp))
        {
            return Err(Verdict::SampledOut);
        }
        let after_l4 = ip.l4().map_or(ip.hdr_end, |o| o + 8);
        Ok(if self.anon.is_some() {
            after_l4
        } else {
            after_l4.saturating_add(self.settings.payload.limit())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(payload: PayloadPolicy, anonymize: bool, non_tcp: NonTcp) -> Settings {
        Settings {
            rate: Rate::ALL,
            rule: Rule::Keyed,
            payload,
            non_tcp,
            anonymize,
        }
    }

    fn key() -> CaptureKey {
        CaptureKey::from_bytes([7u8; 64])
    }

    fn tcp_frame(payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 18, 0, 1], [198, 19, 0, 2], 64)
            .tcp(40000, 80, 1000, 65535)
            .write(&mut v, payload)
            .unwrap();
        v
    }

    #[test]
    fn payload_policy_cuts_after_k_bytes() {
        let f = tcp_frame(b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n");
        let hdr = 14 + 20 + 20;
        for (policy, want) in [
            (PayloadPolicy::Bytes(0), hdr),
            (PayloadPolicy::Bytes(14), hdr + 14),
            (PayloadPolicy::All, f.len()),
        ] {
            let mut p = Processor::new(settings(policy, false, NonTcp::Drop), &key());
            let mut out = Vec::new();
            assert_eq!(
                p.process(LinkType::Ethernet, &f, f.len() as u32, &mut out),
                Verdict::Keep(want)
            );
            assert_eq!(out, f[..want]);
        }
        // Ethernet padding after a short segment is never kept
        let mut padded = tcp_frame(b"");
        padded.extend_from_slice(&[0u8; 6]);
        let mut p = Processor::new(settings(PayloadPolicy::All, false, NonTcp::Drop), &key());
        let mut out = Vec::new();
        assert_eq!(
            p.process(LinkType::Ethernet, &padded, 60, &mut out),
            Verdict::Keep(54)
        );
    }

    #[test]
    fn non_tcp_policy() {
        let mut udp = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([198, 18, 0, 1], [198, 19, 0, 2], 64)
            .udp(5353, 53)
            .write(&mut udp, &[1u8; 100])
            .unwrap();
        let mut arp = vec![0xffu8; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        let mut out = Vec::new();
        let mut drop = Processor::new(
            settings(PayloadPolicy::Bytes(0), true, NonTcp::Drop),
            &key(),
        );
        assert_eq!(
            drop.process(LinkType::Ethernet, &udp, 142, &mut out),
            Verdict::NonTcpDropped
        );
        let mut keep_anon = Processor::new(
            settings(PayloadPolicy::Bytes(64), true, NonTcp::Keep),
            &key(),
        );
        assert_eq!(
            keep_anon.process(LinkType::Ethernet, &udp, 142, &mut out),
            Verdict::Keep(14 + 20 + 8)
        );
        assert_eq!(
            keep_anon.process(LinkType::Ethernet, &arp, 42, &mut out),
            Verdict::Unanonymizable
        );
        let mut keep = Processor::new(
            settings(PayloadPolicy::Bytes(10), false, NonTcp::Keep),
            &key(),
        );
        assert_eq!(
            keep.process(LinkType::Ethernet, &udp, 142, &mut out),
            Verdict::Keep(14 + 20 + 8 + 10)
        );
        assert_eq!(
            keep.process(LinkType::Ethernet, &arp, 42, &mut out),
            Verdict::Keep(42)
        );
        assert_eq!(keep.counters.kept, 2);
        assert_eq!(keep.counters.received, 2);
    }

    #[test]
    fn malformed_is_counted() {
        let f = tcp_frame(b"");
        let mut p = Processor::new(
            settings(PayloadPolicy::Bytes(0), true, NonTcp::Keep),
            &key(),
        );
        let mut out = Vec::new();
        assert_eq!(
            p.process(LinkType::Ethernet, &f[..40], 54, &mut out),
            Verdict::Malformed(DecodeError::TruncatedTcpHeader)
        );
        assert!(out.is_empty());
        assert_eq!(p.counters.malformed, 1);
    }
}
