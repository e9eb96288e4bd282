//! `--filter`: a BPF capture filter written as tcpdump takes it (`tcp port 443`, `host
//! 10.0.0.1 and not port 22`), compiled by libpcap for each link type the inputs carry (a
//! pcapng file may hold interfaces of several) and run on each frame before the analyzer sees
//! it, as `tcpdump -r FILE EXPR` would select it.

use std::collections::HashMap;
use std::os::raw::{c_int, c_uint, c_void};

use mimic_core::packet::LinkType;
use pcap::{BpfProgram, Capture, Linktype};

#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("capture filter {expr}: {message}")]
    Invalid { expr: String, message: String },
    #[error(
        "{file}: capture filter {expr} cannot be compiled for link type {link} of this input: {message}"
    )]
    LinkType {
        file: String,
        expr: String,
        link: String,
        message: String,
    },
}

/// One filter expression and its programs, compiled on first sight of each link type.
pub struct CaptureFilter {
    expr: String,
    programs: HashMap<i32, Result<BpfProgram, String>>,
}

impl std::fmt::Debug for CaptureFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureFilter")
            .field("expr", &self.expr)
            .finish_non_exhaustive()
    }
}

/// The expression as messages show it, quoted: whole up to 200 characters, else its start and
/// its length (an OR list of hundreds of hosts would fill the screen).
pub fn brief(expr: &str) -> String {
    const SHOWN: usize = 200;
    let n = expr.chars().count();
    if n <= SHOWN {
        return format!("{expr:?}");
    }
    let head: String = expr.chars().take(SHOWN - 40).collect();
    format!("{head:?}… ({n} characters)")
}

/// The libpcap link type (`DLT_*`) a frame of `link` is compiled for. The file formats carry
/// `LINKTYPE_*` values; they are the same numbers except LINKTYPE_RAW (101), which libpcap
/// compiles as DLT_RAW (12 on Linux).
fn dlt(link: LinkType) -> i32 {
    match link {
        LinkType::Raw => 12,
        other => other.to_u32() as i32,
    }
}

/// libpcap's name of a link type (`EN10MB`, `RAW`, …), or its number.
fn link_name(link: LinkType) -> String {
    let v = dlt(link);
    match Linktype(v).get_name() {
        Ok(n) => format!("{n} ({})", link.to_u32()),
        Err(_) => link.to_u32().to_string(),
    }
}

/// `expr` compiled for `dlt`; `optimize` as tcpdump compiles it (the analysis), or not (a
/// syntax check: libpcap's optimizer is what takes long).
fn compile(expr: &str, dlt: i32, optimize: bool) -> Result<BpfProgram, String> {
    let dead = Capture::dead(Linktype(dlt)).map_err(|e| e.to_string())?;
    dead.compile(expr, optimize).map_err(|e| e.to_string())
}

impl CaptureFilter {
    /// Whether `expr` is a filter libpcap can compile for Ethernet, without its optimizer
    /// (the same parser and code generator; the optimizer, which [`CaptureFilter::new`] runs,
    /// takes seconds on long OR lists, and a flag check should not pay for it twice). An
    /// expression that optimizes to nothing ("expression rejects all packets") passes here and
    /// is refused by `new`.
    pub fn check(expr: &str) -> Result<(), FilterError> {
        compile(expr, dlt(LinkType::Ethernet), false)
            .map(|_| ())
            .map_err(|message| FilterError::Invalid {
                expr: brief(expr),
                message,
            })
    }

    /// Compiles `expr` for Ethernet, so that a mistake in it is reported before any input is
    /// read; programs for other link types are compiled when a frame of theirs arrives.
    pub fn new(expr: &str) -> Result<CaptureFilter, FilterError> {
        let ether = dlt(LinkType::Ethernet);
        let prog = compile(expr, ether, true).map_err(|message| FilterError::Invalid {
            expr: brief(expr),
            message,
        })?;
        Ok(CaptureFilter {
            expr: expr.to_string(),
            programs: HashMap::from([(ether, Ok(prog))]),
        })
    }

    /// The expression as given.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// Whether the filter accepts a frame of `link` whose captured bytes are `data` and whose
    /// length on the wire was `wire_len` (what `len`, `greater` and `less` test: a frame cut
    /// by a snaplen is still as long as it was). `file` names the input in an error: an
    /// expression that libpcap cannot compile for this link type (`ether host` on raw IP).
    pub fn matches(
        &mut self,
        file: &str,
        link: LinkType,
        data: &[u8],
        wire_len: u32,
    ) -> Result<bool, FilterError> {
        let d = dlt(link);
        let expr = &self.expr;
        let prog = self
            .programs
            .entry(d)
            .or_insert_with(|| compile(expr, d, true));
        match prog {
            Ok(p) => Ok(match null_header_in_host_order(link, data) {
                Some(fixed) => run(p, &fixed, wire_len),
                None => run(p, data, wire_len),
            }),
            Err(message) => Err(FilterError::LinkType {
                file: file.to_string(),
                expr: brief(&self.expr),
                link: link_name(link),
                message: message.clone(),
            }),
        }
    }
}

/// A BSD NULL frame whose address family is in the other byte order than this host's (written
/// by a machine of the other endianness), with those four bytes swapped; `None` for every other
/// frame. libpcap's programs for DLT_NULL test the family in host order and libpcap swaps it
/// when it reads a byte-swapped file; a program compiled for the link type alone cannot know
/// the file, so the header is put in host order here. Families are small numbers (2, 10, 24,
/// 28, 30), so the order that gives one is the file's.
fn null_header_in_host_order(link: LinkType, data: &[u8]) -> Option<Vec<u8>> {
    if link != LinkType::Null {
        return None;
    }
    let af = u32::from_ne_bytes(data.get(..4)?.try_into().ok()?);
    if af <= 0xffff || af.swap_bytes() > 0xffff {
        return None;
    }
    let mut fixed = data.to_vec();
    fixed[..4].copy_from_slice(&af.swap_bytes().to_ne_bytes());
    Some(fixed)
}

/// libpcap's `struct pcap_pkthdr`.
#[repr(C)]
struct PktHdr {
    ts: libc::timeval,
    caplen: c_uint,
    len: c_uint,
}

extern "C" {
    /// From libpcap, which the `pcap` crate links.
    fn pcap_offline_filter(prog: *const c_void, hdr: *const PktHdr, pkt: *const u8) -> c_int;
}

/// Runs a compiled program on one frame. `BpfProgram::filter` gives libpcap the captured
/// length as the wire length too, which makes `greater 1000` false for every frame of a
/// headers-only capture; this passes both.
fn run(prog: &BpfProgram, data: &[u8], wire_len: u32) -> bool {
    let caplen = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let hdr = PktHdr {
        ts: libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
        caplen,
        len: wire_len.max(caplen),
    };
    // SAFETY: `BpfProgram` is `#[repr(transparent)]` over libpcap's `struct bpf_program`
    // (pcap 2.x), so a reference to it points at a valid, compiled program that lives for
    // the call; `hdr` is a `struct pcap_pkthdr` whose caplen is the length of `data`, which
    // is all the bytes libpcap's BPF interpreter may read (it checks every load against
    // caplen).
    unsafe {
        pcap_offline_filter(
            prog as *const BpfProgram as *const c_void,
            &hdr,
            data.as_ptr(),
        ) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 (10.0.0.1 → 10.0.0.2) + TCP (40000 → `dport`, SYN), 54 bytes.
    fn syn_frame(dport: u16) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
        f.extend(&ip_tcp(dport));
        f
    }

    fn ip_tcp(dport: u16) -> Vec<u8> {
        let mut v = vec![
            0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        v.extend(40000u16.to_be_bytes());
        v.extend(dport.to_be_bytes());
        v.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        v
    }

    #[test]
    fn selects_frames_as_tcpdump_would() {
        let mut f = CaptureFilter::new("tcp port 443").unwrap();
        assert!(f
            .matches("a", LinkType::Ethernet, &syn_frame(443), 54)
            .unwrap());
        assert!(!f
            .matches("a", LinkType::Ethernet, &syn_frame(80), 54)
            .unwrap());
        // the same packet without a link header: compiled for raw IP on first sight
        assert!(f.matches("a", LinkType::Raw, &ip_tcp(443), 40).unwrap());
        assert!(!f.matches("a", LinkType::Raw, &ip_tcp(80), 40).unwrap());
        let mut f = CaptureFilter::new("host 10.0.0.2 and tcp[tcpflags] & tcp-syn != 0").unwrap();
        assert!(f
            .matches("a", LinkType::Ethernet, &syn_frame(80), 54)
            .unwrap());
        let mut f = CaptureFilter::new("ip6 or vlan").unwrap();
        assert!(!f
            .matches("a", LinkType::Ethernet, &syn_frame(80), 54)
            .unwrap());
    }

    /// A frame cut by the snaplen is judged by its length on the wire.
    #[test]
    fn a_null_header_from_a_machine_of_the_other_byte_order_is_read_in_its_order() {
        let mut f = CaptureFilter::new("tcp[tcpflags] & tcp-syn != 0 and ip").unwrap();
        let ip = syn_frame(80)[14..].to_vec();
        for af in [2u32.to_ne_bytes(), 2u32.swap_bytes().to_ne_bytes()] {
            let frame = [af.as_slice(), &ip].concat();
            let n = frame.len() as u32;
            assert!(f.matches("a", LinkType::Null, &frame, n).unwrap(), "{af:?}");
        }
        // a family that is no family in either order is left alone (and not IPv4)
        let frame = [[0x12, 0x34, 0x56, 0x78].as_slice(), &ip].concat();
        let n = frame.len() as u32;
        assert!(!f.matches("a", LinkType::Null, &frame, n).unwrap());
    }

    #[test]
    fn length_tests_use_the_wire_length() {
        let mut f = CaptureFilter::new("greater 1000").unwrap();
        assert!(f
            .matches("a", LinkType::Ethernet, &syn_frame(80), 1514)
            .unwrap());
        assert!(!f
            .matches("a", LinkType::Ethernet, &syn_frame(80), 54)
            .unwrap());
    }

    #[test]
    fn bad_expressions_and_link_types_are_errors() {
        let e = CaptureFilter::new("tcp prot 80").unwrap_err();
        assert!(
            matches!(e, FilterError::Invalid { .. }) && e.to_string().contains("syntax error"),
            "{e}"
        );
        let mut f = CaptureFilter::new("ether host 02:00:00:00:00:01").unwrap();
        let e = f
            .matches("x.pcap", LinkType::Raw, &ip_tcp(80), 40)
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("x.pcap: capture filter \"ether host 02:00:00:00:00:01\"")
                && msg.contains("RAW"),
            "{msg}"
        );
    }

    #[test]
    fn a_long_filter_is_checked_once_and_shown_briefly() {
        let hosts: Vec<String> = (0..300)
            .map(|i| format!("host 10.{}.{}.1", i / 250, i % 250))
            .collect();
        let long = hosts.join(" or ");
        CaptureFilter::check(&long).unwrap();
        let bad = format!("{long} or tcp prot 80");
        let e = CaptureFilter::check(&bad).unwrap_err().to_string();
        assert!(e.contains("syntax error"), "{e}");
        assert!(e.contains(&format!("… ({} characters)", bad.len())), "{e}");
        assert!(e.len() < 300, "{e}");
        assert_eq!(brief("tcp port 80"), "\"tcp port 80\"");
        // what only the optimizer finds is left to `new`
        CaptureFilter::check("tcp and udp").unwrap();
        let e = CaptureFilter::new("tcp and udp").unwrap_err().to_string();
        assert!(e.contains("rejects all packets"), "{e}");
    }
}
