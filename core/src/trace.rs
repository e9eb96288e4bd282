//! Reading trace files: classic pcap (µs and ns, either byte order), pcapng (several sections
//! of either byte order, several interfaces each with its own link type, `if_tsresol` and
//! `if_tsoffset`; EPB, SPB and the obsolete OPB), and gzip-compressed copies of either.
//!
//! The block parsing is pcap-parser's; this module keeps the per-section interface table,
//! turns every timestamp into a [`Timestamp`], and reports what it could not use.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pcap_parser::pcapng::{Block, PcapNGOption};
use pcap_parser::traits::PcapReaderIterator;
use pcap_parser::{create_reader, PcapBlockOwned, PcapError};

use crate::packet::LinkType;
use crate::time::Timestamp;

/// Initial and largest read buffer. The largest single record we accept is a little under
/// the maximum buffer (BIG TCP frames are ~80 KB, jumbo-GRO captures up to 256 KB).
const INITIAL_BUFFER: usize = 1 << 20;
const MAX_BUFFER: usize = 16 << 20;
/// The largest classic pcap record length libpcap and Wireshark accept whatever the snaplen
/// (`MAXIMUM_SNAPLEN`, `WTAP_MAX_PACKET_SIZE_STANDARD`).
const MAX_SNAPLEN: u32 = 262_144;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a pcap or pcapng file (starts with {magic})")]
    NotATrace { path: PathBuf, magic: String },
    /// The input decompresses, but what it holds is not a capture (e.g. `gzip notes.txt`).
    #[error(
        "{path}: a gzip stream whose content is not a pcap or pcapng file (the content starts with {head})"
    )]
    GzipNotATrace { path: PathBuf, head: String },
    #[error("{path}: empty file (no pcap or pcapng header)")]
    Empty { path: PathBuf },
    #[error("{path}: file is cut short in the middle of a record at byte {offset}")]
    Truncated { path: PathBuf, offset: u64 },
    #[error("{path}: corrupt record at byte {offset}: {what}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
}

impl TraceError {
    /// Short reason key for counters (`meta` keys, summaries).
    pub fn reason(&self) -> &'static str {
        match self {
            TraceError::Io { .. } => "io_error",
            TraceError::NotATrace { .. } | TraceError::GzipNotATrace { .. } => "not_a_trace",
            TraceError::Empty { .. } => "empty_file",
            TraceError::Truncated { .. } => "file_truncated",
            TraceError::Corrupt { .. } => "corrupt_record",
        }
    }

    /// The file (or the label of a stream) the error is about.
    pub fn path(&self) -> &Path {
        match self {
            TraceError::Io { path, .. }
            | TraceError::NotATrace { path, .. }
            | TraceError::GzipNotATrace { path, .. }
            | TraceError::Empty { path }
            | TraceError::Truncated { path, .. }
            | TraceError::Corrupt { path, .. } => path,
        }
    }
}

/// One captured frame, borrowed from the reader until the next call.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub ts: Timestamp,
    pub link: LinkType,
    /// Length on the wire (may exceed `data.len()` when a snaplen cut the frame).
    pub wire_len: u32,
    pub data: &'a [u8],
    /// Interface index within its pcapng section (0 for classic pcap).
    pub interface: u32,
}

/// Frames (or other records) the reader passed over, by reason.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadStats {
    pub frames: u64,
    /// Timestamp does not fit the supported range (years 1678–2262); frame skipped.
    pub ts_out_of_range: u64,
    /// Sub-second field ≥ one second (carried into the seconds, frame kept).
    pub ts_invalid_fraction: u64,
    /// Simple Packet Blocks carry no timestamp; they get the previous frame's time.
    pub ts_missing: u64,
    /// A packet block names an interface its section never described; frame skipped.
    pub unknown_interface: u64,
    /// Interface statistics blocks: packets the capturing interface reported dropping (the last
    /// count of each interface, summed over interfaces and sections).
    pub if_dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Pcap { nanos: bool, big_endian: bool },
    PcapNg,
}

#[derive(Debug, Clone)]
struct Interface {
    link: LinkType,
    units_per_sec: u64,
    offset_secs: i64,
    /// The last `isb_ifdrop` reported for the interface.
    dropped: u64,
}

struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A gzip stream read up to where it is cut off: the end of what can be decompressed is the
/// end of the input (as for a plain file cut short), and `cut` says the stream was incomplete.
/// Without it, a stream cut inside the first read buffer failed the whole file.
struct GzipUpToCut<R> {
    inner: R,
    cut: Arc<AtomicBool>,
}

impl<R: Read> Read for GzipUpToCut<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                self.cut.store(true, Ordering::Relaxed);
                Ok(0)
            }
            r => r,
        }
    }
}

/// A streaming reader of one trace file. Memory stays bounded by the read buffer.
pub struct TraceReader {
    path: PathBuf,
    inner: Box<dyn PcapReaderIterator + Send>,
    format: Option<Format>,
    legacy_link: LinkType,
    legacy_units: u64,
    legacy_snaplen: u32,
    /// Classic pcap record header size (24 in the "modified" format, else 16).
    legacy_record_header: usize,
    interfaces: Vec<Interface>,
    section_big_endian: bool,
    pending_consume: usize,
    last_ts: Timestamp,
    buffer_size: usize,
    bytes_read: Arc<AtomicU64>,
    file_size: u64,
    gzip: bool,
    /// The gzip stream ended before its end (see [`GzipUpToCut`]).
    gzip_cut: Arc<AtomicBool>,
    pub stats: ReadStats,
}

impl TraceReader {
    /// Opens a trace file, detecting gzip, pcap and pcapng from its first bytes.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceReader, TraceError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |source| TraceError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io_err)?;
        let file_size = file.metadata().map_err(io_err)?.len();
        Self::from_stream(path, Box::new(file), file_size)
    }

    /// Reads a trace held in memory; `label` names it in errors.
    pub fn from_bytes(
        label: impl Into<PathBuf>,
        bytes: Vec<u8>,
    ) -> Result<TraceReader, TraceError> {
        let size = bytes.len() as u64;
        Self::from_stream(label.into(), Box::new(io::Cursor::new(bytes)), size)
    }

    /// Reads a trace from a stream that cannot seek (standard input, a pipe), front to back
    /// like a file; `label` names it in errors. Its size is unknown ([`Self::file_size`] is 0).
    pub fn from_reader(
        label: impl Into<PathBuf>,
        input: Box<dyn Read + Send>,
    ) -> Result<TraceReader, TraceError> {
        Self::from_stream(label.into(), input, 0)
    }

    /// Detects gzip from the first two bytes, then pcap or pcapng from the first bytes of the
    /// (decompressed) content. Nothing is read twice and nothing seeks: the bytes looked at
    /// are handed on in front of the rest of the stream.
    fn from_stream(
        path: PathBuf,
        input: Box<dyn Read + Send>,
        file_size: u64,
    ) -> Result<TraceReader, TraceError> {
        let io_err = |source| TraceError::Io {
            path: path.clone(),
            source,
        };
        let bytes_read = Arc::new(AtomicU64::new(0));
        let mut counted = CountingReader {
            inner: input,
            count: bytes_read.clone(),
        };
        let mut magic = [0u8; 2];
        let n = read_up_to(&mut counted, &mut magic).map_err(io_err)?;
        if n == 0 {
            return Err(TraceError::Empty { path });
        }
        let gzip = magic[..n] == [0x1f, 0x8b];
        let raw = io::Cursor::new(magic[..n].to_vec()).chain(counted);
        let gzip_cut = Arc::new(AtomicBool::new(false));
        let mut source: Box<dyn Read + Send> = if gzip {
            Box::new(GzipUpToCut {
                inner: flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 16, raw)),
                cut: gzip_cut.clone(),
            })
        } else {
            Box::new(raw)
        };
        let head = match read_head(&mut source) {
            Ok(h) => h,
            Err(e) if gzip => {
                return Err(TraceError::Io {
                    path,
                    source: io::Error::other(format!("corrupt gzip stream ({e})")),
                })
            }
            Err(e) => return Err(io_err(e)),
        };
        if head.is_empty() {
            // a gzip stream of nothing, or cut before its first byte of content
            return Err(if gzip_cut.load(Ordering::Relaxed) {
                TraceError::Truncated { path, offset: 0 }
            } else {
                TraceError::Empty { path }
            });
        }
        let source: Box<dyn Read + Send> = Box::new(io::Cursor::new(head.clone()).chain(source));
        let inner = match create_reader(INITIAL_BUFFER, source) {
            Ok(r) => r,
            Err(PcapError::Eof) if gzip_cut.load(Ordering::Relaxed) => {
                return Err(TraceError::Truncated { path, offset: 0 })
            }
            Err(PcapError::Eof) => return Err(TraceError::Empty { path }),
            Err(PcapError::Incomplete(_)) | Err(PcapError::UnexpectedEof) => {
                return Err(TraceError::Truncated { path, offset: 0 })
            }
            Err(PcapError::ReadError) => {
                return Err(TraceError::Io {
                    path,
                    source: io::Error::other("read failed (corrupt gzip stream?)"),
                })
            }
            // a pcapng section header that the input ends inside (pcap-parser calls it
            // unrecognized): the file is cut short, not something else
            Err(_) if head.starts_with(&PCAPNG_SHB) && shb_cut_short(&head) => {
                return Err(TraceError::Truncated { path, offset: 0 })
            }
            Err(_) if gzip => {
                return Err(TraceError::GzipNotATrace {
                    path,
                    head: describe_bytes(&head),
                })
            }
            Err(_) => {
                return Err(TraceError::NotATrace {
                    path,
                    magic: describe_bytes(&head),
                });
            }
        };
        Ok(TraceReader {
            path,
            inner,
            format: None,
            legacy_link: LinkType::Unknown(u32::MAX),
            legacy_units: 1_000_000,
            legacy_snaplen: 0,
            legacy_record_header: 16,
            interfaces: Vec::new(),
            section_big_endian: false,
            pending_consume: 0,
            last_ts: Timestamp::ZERO,
            buffer_size: INITIAL_BUFFER,
            bytes_read,
            file_size,
            gzip,
            gzip_cut,
            stats: ReadStats::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn format(&self) -> Option<Format> {
        self.format
    }
    pub fn is_gzip(&self) -> bool {
        self.gzip
    }
    /// Size of the file on disk (compressed size for `.gz`).
    pub fn file_size(&self) -> u64 {
        self.file_size
    }
    /// A counter of bytes read from the file so far (compressed bytes for `.gz`), for progress.
    pub fn bytes_read_counter(&self) -> Arc<AtomicU64> {
        self.bytes_read.clone()
    }
    /// Link type of the classic pcap header, or of the first pcapng interface.
    pub fn primary_link_type(&self) -> Option<LinkType> {
        match self.format {
            Some(Format::Pcap { .. }) => Some(self.legacy_link),
            Some(Format::PcapNg) => self.interfaces.first().map(|i| i.link),
            None => None,
        }
    }

    fn position(&self) -> u64 {
        self.inner.consumed() as u64
    }

    /// The next frame, `Ok(None)` at the end of the file. After an error the file cannot be
    /// read further (classic pcap has no markers to resynchronise on); frames returned before
    /// it remain valid.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, TraceError> {
        if self.pending_consume > 0 {
            self.inner.consume_noshift(self.pending_consume);
            self.pending_consume = 0;
        }
        loop {
            let step = match self.inner.next() {
                Ok((offset, block)) => {
                    classify(offset, block, &mut self.format, self.section_big_endian)
                }
                Err(PcapError::Eof) if self.gzip_cut.load(Ordering::Relaxed) => {
                    // cut between two records: still a file cut short
                    return Err(self.truncated());
                }
                Err(PcapError::Eof) => return Ok(None),
                Err(PcapError::Incomplete(_)) => {
                    let before = self.inner.data().len();
                    if self.inner.refill().is_err() {
                        return Err(self.truncated());
                    }
                    // At the end of the input the next call reports a clean end or a cut
                    // record; a refill that adds nothing with input left means the buffer is
                    // full, which the next call reports as too small.
                    if self.inner.data().len() == before
                        && !self.inner.reader_exhausted()
                        && self.buffer_size >= MAX_BUFFER
                    {
                        return Err(self.truncated());
                    }
                    continue;
                }
                Err(PcapError::BufferTooSmall) => {
                    if self.buffer_size >= MAX_BUFFER {
                        return Err(TraceError::Corrupt {
                            path: self.path.clone(),
                            offset: self.position(),
                            what: self.impossible_record_length().unwrap_or_else(|| {
                                format!("record larger than {} MiB", MAX_BUFFER >> 20)
                            }),
                        });
                    }
                    self.buffer_size *= 2;
                    self.inner.grow(self.buffer_size);
                    if self.inner.refill().is_err() {
                        return Err(self.truncated());
                    }
                    continue;
                }
                Err(PcapError::UnexpectedEof) => return Err(self.truncated()),
                Err(PcapError::ReadError) => {
                    return Err(TraceError::Io {
                        path: self.path.clone(),
                        source: io::Error::other("read failed (corrupt gzip stream?)"),
                    })
                }
                Err(e) => {
                    let what = match e {
                        PcapError::HeaderNotRecognized => "block header not recognized".to_string(),
                        PcapError::NomError(_, kind) => format!("unparseable block ({kind:?})"),
                        PcapError::OwnedNomError(_, kind) => {
                            format!("unparseable block ({kind:?})")
                        }
                        other => format!("{other:?}"),
                    };
                    return Err(TraceError::Corrupt {
                        path: self.path.clone(),
                        offset: self.position(),
                        what,
                    });
                }
            };
            match step {
                Step::Skip(offset) => self.inner.consume_noshift(offset),
                Step::LegacyHeader {
                    offset,
                    link,
                    nanos,
                    big_endian,
                    snaplen,
                    record_header,
                } => {
                    self.legacy_link = link;
                    self.legacy_snaplen = snaplen;
                    self.legacy_record_header = record_header;
                    self.legacy_units = if nanos { 1_000_000_000 } else { 1_000_000 };
                    self.format = Some(Format::Pcap { nanos, big_endian });
                    self.inner.consume_noshift(offset);
                }
                Step::Section { offset, big_endian } => {
                    self.interfaces.clear();
                    self.section_big_endian = big_endian;
                    self.inner.consume_noshift(offset);
                }
                Step::Interface {
                    offset,
                    link,
                    units_per_sec,
                    offset_secs,
                } => {
                    self.interfaces.push(Interface {
                        link,
                        units_per_sec,
                        offset_secs,
                        dropped: 0,
                    });
                    self.inner.consume_noshift(offset);
                }
                Step::IfStats {
                    offset,
                    iface,
                    dropped,
                } => {
                    // isb_ifdrop counts from the start of the capture: a later block for the
                    // same interface replaces the count of an earlier one
                    if let Some(dropped) = dropped {
                        let s = &mut self.stats;
                        if let Some(i) = self.interfaces.get_mut(iface as usize) {
                            s.if_dropped = s.if_dropped.saturating_sub(i.dropped);
                            i.dropped = dropped;
                        }
                        s.if_dropped = s.if_dropped.saturating_add(dropped);
                    }
                    self.inner.consume_noshift(offset);
                }
                Step::Packet {
                    offset,
                    ts,
                    iface,
                    wire_len,
                    data_ptr,
                    data_len,
                } => {
                    let (link, ts) = match ts {
                        RawTs::Legacy { secs, frac } => {
                            if frac as u64 >= self.legacy_units {
                                self.stats.ts_invalid_fraction += 1;
                            }
                            (
                                self.legacy_link,
                                Timestamp::from_parts(secs as i64, frac as u64, self.legacy_units),
                            )
                        }
                        RawTs::Ng(units) => match self.interfaces.get(iface as usize) {
                            Some(i) => {
                                let secs = (units / i.units_per_sec) as i64;
                                let frac = units % i.units_per_sec;
                                (
                                    i.link,
                                    secs.checked_add(i.offset_secs).and_then(|s| {
                                        Timestamp::from_parts(s, frac, i.units_per_sec)
                                    }),
                                )
                            }
                            None => {
                                self.stats.unknown_interface += 1;
                                self.inner.consume_noshift(offset);
                                continue;
                            }
                        },
                        RawTs::None => match self.interfaces.first() {
                            Some(i) => {
                                self.stats.ts_missing += 1;
                                (i.link, Some(self.last_ts))
                            }
                            None => {
                                self.stats.unknown_interface += 1;
                                self.inner.consume_noshift(offset);
                                continue;
                            }
                        },
                    };
                    let Some(ts) = ts else {
                        self.stats.ts_out_of_range += 1;
                        self.inner.consume_noshift(offset);
                        continue;
                    };
                    // Locate the packet bytes in the (still unconsumed) buffer.
                    let buf = self.inner.data();
                    let start = data_ptr.wrapping_sub(buf.as_ptr() as usize);
                    let Some(data) = start
                        .checked_add(data_len)
                        .and_then(|end| buf.get(start..end))
                    else {
                        return Err(TraceError::Corrupt {
                            path: self.path.clone(),
                            offset: self.position(),
                            what: "packet data outside its block".into(),
                        });
                    };
                    self.last_ts = ts;
                    self.stats.frames += 1;
                    self.pending_consume = offset;
                    return Ok(Some(Frame {
                        ts,
                        link,
                        wire_len,
                        data,
                        interface: iface,
                    }));
                }
            }
        }
    }

    /// The error for input that ends inside a record: cut short, unless the record is a
    /// classic pcap record whose length field no capture could hold (the input then ends
    /// inside it only because it claims so much).
    fn truncated(&self) -> TraceError {
        match self.impossible_record_length() {
            Some(what) => TraceError::Corrupt {
                path: self.path.clone(),
                offset: self.position(),
                what,
            },
            None => TraceError::Truncated {
                path: self.path.clone(),
                offset: self.position(),
            },
        }
    }

    /// What is wrong with the length field of the record at the read position, if no capture
    /// could hold it: a classic pcap record claiming more than the snaplen allows (and more
    /// than libpcap accepts whatever the snaplen), or any record or block larger than this
    /// reader accepts.
    fn impossible_record_length(&self) -> Option<String> {
        let d = self.inner.data();
        let field = |at: usize, big_endian: bool| -> Option<u32> {
            Some(u32_in(d.get(at..at + 4)?.try_into().ok()?, big_endian))
        };
        let (mut what, left) = match self.format? {
            Format::Pcap { big_endian, .. } => {
                let caplen = field(8, big_endian)?;
                let snaplen = self.legacy_snaplen;
                let what = if caplen > snaplen.max(MAX_SNAPLEN) {
                    let limit = if snaplen >= MAX_SNAPLEN {
                        format!("the snaplen of {snaplen} allows")
                    } else {
                        format!("libpcap accepts ({MAX_SNAPLEN}; the snaplen is {snaplen})")
                    };
                    format!("record claims {caplen} bytes of packet data, more than {limit}")
                } else if caplen as usize >= MAX_BUFFER {
                    format!(
                        "record claims {caplen} bytes of packet data, more than the largest \
                         record accepted ({} MiB)",
                        MAX_BUFFER >> 20
                    )
                } else {
                    return None;
                };
                (what, d.len().saturating_sub(self.legacy_record_header))
            }
            Format::PcapNg => {
                // a section header is in its own byte order, given by its byte-order magic
                let big_endian = if d.get(..4) == Some(&[0x0a, 0x0d, 0x0d, 0x0a][..]) {
                    d.get(8..12)? == [0x1a, 0x2b, 0x3c, 0x4d]
                } else {
                    self.section_big_endian
                };
                let len = field(4, big_endian)?;
                if (len as usize) < MAX_BUFFER {
                    return None;
                }
                let what = format!(
                    "block claims {len} bytes, more than the largest block accepted ({} MiB)",
                    MAX_BUFFER >> 20
                );
                (what, d.len().saturating_sub(8))
            }
        };
        if self.inner.reader_exhausted() {
            what += &format!(" (the file holds {left} more bytes)");
        }
        Some(what)
    }
}

/// The block type of a pcapng Section Header Block (the same in either byte order).
const PCAPNG_SHB: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];
/// A Section Header Block's fixed part: type, length, byte-order magic, version, section length.
const SHB_MIN: usize = 28;

/// The first bytes of a (decompressed) trace, enough for pcap-parser to recognise the format
/// from them alone: a classic pcap header, or a pcapng Section Header Block whole (its length
/// field says how long it is, in the byte order its byte-order magic gives). Shorter only at
/// the end of the input.
fn read_head(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; SHB_MIN];
    let n = read_up_to(r, &mut head)?;
    head.truncate(n);
    if let Some(len) = shb_length(&head) {
        if len > head.len() && len <= INITIAL_BUFFER {
            let mut rest = vec![0u8; len - head.len()];
            let k = read_up_to(r, &mut rest)?;
            head.extend_from_slice(&rest[..k]);
        }
    }
    Ok(head)
}

/// The total length a Section Header Block at the start of `head` claims, if `head` starts
/// with one and holds its length and byte-order magic.
fn shb_length(head: &[u8]) -> Option<usize> {
    if !head.starts_with(&PCAPNG_SHB) {
        return None;
    }
    let len: [u8; 4] = head.get(4..8)?.try_into().ok()?;
    let big_endian = match head.get(8..12)? {
        [0x1a, 0x2b, 0x3c, 0x4d] => true,
        [0x4d, 0x3c, 0x2b, 0x1a] => false,
        _ => return None,
    };
    Some(u32_in(len, big_endian) as usize)
}

/// Whether the input ended inside the Section Header Block it starts with (its fixed part, or
/// the length it claims).
fn shb_cut_short(head: &[u8]) -> bool {
    head.len() < SHB_MIN || shb_length(head).is_some_and(|len| head.len() < len)
}

/// The first bytes of an input that is not a capture, for an error message: in hex, and as
/// text too when they read as text.
fn describe_bytes(head: &[u8]) -> String {
    let first = &head[..head.len().min(8)];
    let hex = first
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    let shown = &head[..head.len().min(24)];
    let text = shown
        .iter()
        .all(|b| b.is_ascii_graphic() || matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if text {
        let t: String = shown.iter().map(|&b| b as char).collect();
        format!("bytes {hex}, text {t:?}")
    } else {
        format!("bytes {hex}")
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

enum RawTs {
    Legacy {
        secs: u32,
        frac: u32,
    },
    /// Raw pcapng timestamp in interface units.
    Ng(u64),
    None,
}

/// What a block means for the reader, with no borrow of the block left.
enum Step {
    Skip(usize),
    LegacyHeader {
        offset: usize,
        link: LinkType,
        nanos: bool,
        big_endian: bool,
        snaplen: u32,
        record_header: usize,
    },
    Section {
        offset: usize,
        big_endian: bool,
    },
    Interface {
        offset: usize,
        link: LinkType,
        units_per_sec: u64,
        offset_secs: i64,
    },
    IfStats {
        offset: usize,
        iface: u32,
        dropped: Option<u64>,
    },
    Packet {
        offset: usize,
        ts: RawTs,
        iface: u32,
        wire_len: u32,
        data_ptr: usize,
        data_len: usize,
    },
}

fn classify(
    offset: usize,
    block: PcapBlockOwned<'_>,
    format: &mut Option<Format>,
    section_be: bool,
) -> Step {
    match block {
        PcapBlockOwned::LegacyHeader(h) => Step::LegacyHeader {
            offset,
            // the upper bits of the link-type field carry FCS information (libpcap masks them)
            link: LinkType::from_u32((h.network.0 as u32) & 0x03ff_ffff),
            nanos: h.is_nanosecond_precision(),
            big_endian: h.is_bigendian(),
            snaplen: h.snaplen,
            record_header: if h.is_modified_format() { 24 } else { 16 },
        },
        PcapBlockOwned::Legacy(b) => Step::Packet {
            offset,
            ts: RawTs::Legacy {
                secs: b.ts_sec,
                frac: b.ts_usec,
            },
            iface: 0,
            wire_len: b.origlen,
            data_ptr: b.data.as_ptr() as usize,
            data_len: b.data.len().min(b.caplen as usize),
        },
        PcapBlockOwned::NG(block) => {
            *format = Some(Format::PcapNg);
            match block {
                Block::SectionHeader(shb) => Step::Section {
                    offset,
                    big_endian: shb.big_endian(),
                },
                Block::InterfaceDescription(idb) => Step::Interface {
                    offset,
                    link: LinkType::from_u32(idb.linktype.0 as u32),
                    // an invalid if_tsresol falls back to the default (microseconds)
                    units_per_sec: idb.ts_resolution().filter(|u| *u > 0).unwrap_or(1_000_000),
                    // if_tsoffset (option code 14), an i64 in section byte order; pcap-parser's
                    // `ts_offset()` reads it little-endian whatever the section. (if_tsresol is
                    // one byte, so its byte order does not matter.)
                    offset_secs: option_u64(&idb.options, 14, section_be)
                        .map(|v| v as i64)
                        .unwrap_or(0),
                },
                Block::EnhancedPacket(epb) => Step::Packet {
                    offset,
                    ts: RawTs::Ng(((epb.ts_high as u64) << 32) | epb.ts_low as u64),
                    iface: epb.if_id,
                    wire_len: epb.origlen,
                    data_ptr: epb.data.as_ptr() as usize,
                    data_len: epb.data.len().min(epb.caplen as usize),
                },
                Block::SimplePacket(spb) => Step::Packet {
                    offset,
                    ts: RawTs::None,
                    iface: 0,
                    wire_len: spb.origlen,
                    data_ptr: spb.data.as_ptr() as usize,
                    data_len: spb.data.len().min(spb.origlen as usize),
                },
                Block::InterfaceStatistics(isb) => {
                    // isb_ifdrop (option code 5), a u64 in section byte order
                    Step::IfStats {
                        offset,
                        iface: isb.if_id,
                        dropped: option_u64(&isb.options, 5, section_be),
                    }
                }
                // pcap-parser reads an unknown block's type little-endian whatever the section
                Block::Unknown(u) if section_u32(u.block_type, section_be) == 2 => {
                    // Obsolete Packet Block: if_id(2) drops(2) ts_high(4) ts_low(4) caplen(4) len(4) data
                    let d = u.data;
                    if d.len() < 20 {
                        return Step::Skip(offset);
                    }
                    let r16 = |i: usize| {
                        if section_be {
                            u16::from_be_bytes([d[i], d[i + 1]])
                        } else {
                            u16::from_le_bytes([d[i], d[i + 1]])
                        }
                    };
                    let r32 = |i: usize| u32_in([d[i], d[i + 1], d[i + 2], d[i + 3]], section_be);
                    let caplen = r32(12) as usize;
                    let data = &d[20..];
                    Step::Packet {
                        offset,
                        ts: RawTs::Ng(((r32(4) as u64) << 32) | r32(8) as u64),
                        iface: r16(0) as u32,
                        wire_len: r32(16),
                        data_ptr: data.as_ptr() as usize,
                        data_len: data.len().min(caplen),
                    }
                }
                _ => Step::Skip(offset),
            }
        }
    }
}

/// Four bytes of the file as a u32 in the given byte order.
fn u32_in(b: [u8; 4], big_endian: bool) -> u32 {
    if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    }
}

/// A u32 that pcap-parser read little-endian, in the section's byte order.
fn section_u32(read_le: u32, section_be: bool) -> u32 {
    u32_in(read_le.to_le_bytes(), section_be)
}

/// The first option `code` whose value holds 8 bytes, as a u64 in the section's byte order.
/// pcap-parser keeps option values as the file's raw bytes.
fn option_u64(options: &[PcapNGOption<'_>], code: u16, section_be: bool) -> Option<u64> {
    let o = options
        .iter()
        .find(|o| o.code.0 == code && o.value.len() >= 8)?;
    let mut b = [0u8; 8];
    b.copy_from_slice(&o.value[..8]);
    Some(if section_be {
        u64::from_be_bytes(b)
    } else {
        u64::from_le_bytes(b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pcap_bytes(big_endian: bool, nanos: bool, records: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let mut v = Vec::new();
        let magic: u32 = if nanos { 0xa1b23c4d } else { 0xa1b2c3d4 };
        let w32 = |v: &mut Vec<u8>, x: u32| {
            if big_endian {
                v.extend_from_slice(&x.to_be_bytes())
            } else {
                v.extend_from_slice(&x.to_le_bytes())
            }
        };
        let w16 = |v: &mut Vec<u8>, x: u16| {
            if big_endian {
                v.extend_from_slice(&x.to_be_bytes())
            } else {
                v.extend_from_slice(&x.to_le_bytes())
            }
        };
        w32(&mut v, magic);
        w16(&mut v, 2);
        w16(&mut v, 4);
        w32(&mut v, 0);
        w32(&mut v, 0);
        w32(&mut v, 65535);
        w32(&mut v, 1);
        for (s, f, d) in records {
            w32(&mut v, *s);
            w32(&mut v, *f);
            w32(&mut v, d.len() as u32);
            w32(&mut v, d.len() as u32 + 10);
            v.extend_from_slice(d);
        }
        v
    }

    /// Writes pcapng blocks in one byte order; starts with a section header.
    struct NgWriter {
        big_endian: bool,
        out: Vec<u8>,
    }

    impl NgWriter {
        fn new(big_endian: bool) -> NgWriter {
            let mut w = NgWriter {
                big_endian,
                out: Vec::new(),
            };
            let mut body = w.u32(0x1a2b_3c4d);
            body.extend(w.u16(1));
            body.extend(w.u16(0));
            body.extend(w.u64(u64::MAX)); // section length unknown
            w.block(0x0a0d_0d0a, &body);
            w
        }

        fn u16(&self, x: u16) -> Vec<u8> {
            if self.big_endian {
                x.to_be_bytes().to_vec()
            } else {
                x.to_le_bytes().to_vec()
            }
        }

        fn u32(&self, x: u32) -> Vec<u8> {
            if self.big_endian {
                x.to_be_bytes().to_vec()
            } else {
                x.to_le_bytes().to_vec()
            }
        }

        fn u64(&self, x: u64) -> Vec<u8> {
            if self.big_endian {
                x.to_be_bytes().to_vec()
            } else {
                x.to_le_bytes().to_vec()
            }
        }

        fn block(&mut self, block_type: u32, body: &[u8]) {
            let mut body = body.to_vec();
            body.resize(body.len().next_multiple_of(4), 0);
            let len = self.u32(12 + body.len() as u32);
            self.out.extend(self.u32(block_type));
            self.out.extend(&len);
            self.out.extend(body);
            self.out.extend(&len);
        }

        /// An Ethernet interface with `(code, value)` options.
        fn interface(&mut self, options: &[(u16, Vec<u8>)]) {
            let mut body = self.u16(1);
            body.extend(self.u16(0));
            body.extend(self.u32(65535));
            for (code, value) in options {
                body.extend(self.u16(*code));
                body.extend(self.u16(value.len() as u16));
                body.extend(value);
                body.resize(body.len().next_multiple_of(4), 0);
            }
            if !options.is_empty() {
                body.extend([0; 4]); // opt_endofopt
            }
            self.block(1, &body);
        }

        fn enhanced_packet(&mut self, iface: u32, ts: u64, data: &[u8]) {
            let mut body = self.u32(iface);
            body.extend(self.u32((ts >> 32) as u32));
            body.extend(self.u32(ts as u32));
            body.extend(self.u32(data.len() as u32));
            body.extend(self.u32(data.len() as u32 + 10));
            body.extend(data);
            self.block(6, &body);
        }

        fn interface_statistics(&mut self, iface: u32, dropped: Option<u64>) {
            let mut body = self.u32(iface);
            body.extend([0; 8]); // timestamp
            if let Some(d) = dropped {
                body.extend(self.u16(5)); // isb_ifdrop
                body.extend(self.u16(8));
                body.extend(self.u64(d));
                body.extend([0; 4]); // opt_endofopt
            }
            self.block(5, &body);
        }

        fn obsolete_packet(&mut self, iface: u16, ts: u64, data: &[u8]) {
            let mut body = self.u16(iface);
            body.extend(self.u16(0)); // drops
            body.extend(self.u32((ts >> 32) as u32));
            body.extend(self.u32(ts as u32));
            body.extend(self.u32(data.len() as u32));
            body.extend(self.u32(data.len() as u32 + 10));
            body.extend(data);
            self.block(2, &body);
        }
    }

    /// A temporary file ending in `name`, removed when the returned path is dropped (also when
    /// an assertion fails).
    fn write_tmp(name: &str, bytes: &[u8]) -> tempfile::TempPath {
        let mut f = tempfile::Builder::new()
            .prefix("mimic-core-")
            .suffix(name)
            .tempfile()
            .unwrap();
        f.write_all(bytes).unwrap();
        f.into_temp_path()
    }

    #[test]
    fn classic_pcap_both_orders_and_precisions() {
        for (be, nanos) in [(false, false), (true, false), (false, true), (true, true)] {
            let bytes = pcap_bytes(be, nanos, &[(10, 5, b"abc"), (11, 7, b"defg")]);
            let p = write_tmp(&format!("c{be}{nanos}.pcap"), &bytes);
            let mut r = TraceReader::open(&p).unwrap();
            let f = r.next_frame().unwrap().unwrap();
            let unit = if nanos { 1 } else { 1000 };
            assert_eq!(f.ts, Timestamp::from_nanos(10_000_000_000 + 5 * unit));
            assert_eq!(f.data, b"abc");
            assert_eq!(f.wire_len, 13);
            assert_eq!(f.link, LinkType::Ethernet);
            let f = r.next_frame().unwrap().unwrap();
            assert_eq!(f.data, b"defg");
            assert!(r.next_frame().unwrap().is_none());
            assert_eq!(
                r.format(),
                Some(Format::Pcap {
                    nanos,
                    big_endian: be
                })
            );
        }
    }

    #[test]
    fn gzip_and_truncation() {
        let bytes = pcap_bytes(false, false, &[(1, 0, b"abcdef"), (2, 0, b"ghijkl")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        let p = write_tmp("g.pcap.gz", &gz.finish().unwrap());
        let mut r = TraceReader::open(&p).unwrap();
        assert!(r.is_gzip());
        assert_eq!(r.next_frame().unwrap().unwrap().data, b"abcdef");
        assert_eq!(r.next_frame().unwrap().unwrap().data, b"ghijkl");
        assert!(r.next_frame().unwrap().is_none());

        let p = write_tmp("t.pcap", &bytes[..bytes.len() - 3]);
        let mut r = TraceReader::open(&p).unwrap();
        assert_eq!(r.next_frame().unwrap().unwrap().data, b"abcdef");
        let e = r.next_frame().unwrap_err();
        assert_eq!(e.reason(), "file_truncated");
        assert!(e.to_string().contains("cut short"));

        // a gzip stream cut off (well inside the first read buffer): read up to the cut, as a
        // plain file is, whether the cut falls inside a record or between two
        for keep in [bytes.len() - 3, bytes.len() - 6 - 16] {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&bytes[..keep]).unwrap();
            gz.flush().unwrap();
            // a sync flush emits everything so far; without its trailer the stream is cut
            let z = gz.get_ref().clone();
            let p = write_tmp("c.pcap.gz", &z);
            let mut r = TraceReader::open(&p).unwrap();
            assert_eq!(r.next_frame().unwrap().unwrap().data, b"abcdef");
            let e = r.next_frame().unwrap_err();
            assert_eq!(e.reason(), "file_truncated", "{e}");
        }
    }

    /// A record whose length field no capture could hold made the reader ask for more input
    /// until the file ended, and report the file as cut short.
    #[test]
    fn impossible_record_length_is_corrupt_not_cut_short() {
        for (be, caplen) in [(false, u32::MAX), (true, u32::MAX), (false, 300_000)] {
            let mut bytes = pcap_bytes(be, false, &[(1, 0, b"abcdef")]);
            for x in [2, 0, caplen, 60] {
                bytes.extend(if be {
                    u32::to_be_bytes(x)
                } else {
                    u32::to_le_bytes(x)
                });
            }
            bytes.extend([0u8; 60]);
            let mut r = TraceReader::from_bytes("i.pcap", bytes).unwrap();
            assert_eq!(r.next_frame().unwrap().unwrap().data, b"abcdef");
            let e = r.next_frame().unwrap_err();
            assert!(matches!(e, TraceError::Corrupt { offset: 46, .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("record claims {caplen} bytes"))
                    && msg.contains("more than libpcap accepts (262144; the snaplen is 65535)")
                    && msg.contains("60 more bytes"),
                "{msg}"
            );
        }
    }

    /// The same for a pcapng block whose length field is beyond any block the reader accepts.
    #[test]
    fn impossible_block_length_is_corrupt_not_cut_short() {
        for be in [false, true] {
            let mut w = NgWriter::new(be);
            w.interface(&[]);
            w.enhanced_packet(0, 1, b"abc");
            let good = w.out.len();
            w.enhanced_packet(0, 2, b"def");
            // a last block cut short is still reported so
            let cut = w.out[..w.out.len() - 3].to_vec();
            let mut r = TraceReader::from_bytes(format!("c{be}.pcapng"), cut).unwrap();
            assert_eq!(r.next_frame().unwrap().unwrap().data, b"abc");
            assert_eq!(r.next_frame().unwrap_err().reason(), "file_truncated");
            let bad = w.u32(0xffff_fff0);
            w.out[good + 4..good + 8].copy_from_slice(&bad);
            let mut r = TraceReader::from_bytes(format!("b{be}.pcapng"), w.out).unwrap();
            assert_eq!(r.next_frame().unwrap().unwrap().data, b"abc");
            let e = r.next_frame().unwrap_err();
            assert!(
                matches!(e, TraceError::Corrupt { offset, .. } if offset == good as u64),
                "{e}"
            );
            let msg = e.to_string();
            assert!(
                msg.contains("block claims 4294967280 bytes") && msg.contains("28 more bytes"),
                "{msg}"
            );
        }
    }

    #[test]
    fn not_a_trace() {
        let p = write_tmp("x.txt", b"hello world, not a capture");
        let e = TraceReader::open(&p).err().unwrap();
        assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
        let p = write_tmp("e.pcap", b"");
        assert!(matches!(
            TraceReader::open(&p).err().unwrap(),
            TraceError::Empty { .. }
        ));
    }

    /// `gzip notes.txt` was reported by its compressed magic bytes (`1f 8b 08 08`), which read
    /// like "gzip is not supported".
    #[test]
    fn gzip_of_something_else_says_what_the_content_is() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"hello world, not a capture\n").unwrap();
        let e = TraceReader::from_bytes("notes.txt.gz", gz.finish().unwrap())
            .err()
            .unwrap();
        assert!(matches!(e, TraceError::GzipNotATrace { .. }), "{e}");
        assert_eq!(e.reason(), "not_a_trace");
        assert_eq!(
            e.to_string(),
            "notes.txt.gz: a gzip stream whose content is not a pcap or pcapng file (the content \
             starts with bytes 68 65 6c 6c 6f 20 77 6f, text \"hello world, not a captu\")"
        );
        // binary content: hex only
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&[0u8, 1, 2, 3, 0xff, 0xfe, 7, 8, 9]).unwrap();
        let e = TraceReader::from_bytes("b.gz", gz.finish().unwrap())
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .ends_with("(the content starts with bytes 00 01 02 03 ff fe 07 08)"),
            "{e}"
        );
        // a gzip of nothing is empty, and junk after the gzip magic is a corrupt stream
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let e = TraceReader::from_bytes("e.gz", gz.finish().unwrap())
            .err()
            .unwrap();
        assert!(matches!(e, TraceError::Empty { .. }), "{e}");
        let e = TraceReader::from_bytes("j.gz", b"\x1f\x8bjunk junk junk".to_vec())
            .err()
            .unwrap();
        assert!(e.to_string().contains("corrupt gzip stream"), "{e}");
    }

    /// A pcapng file cut inside its section header was "not a pcap or pcapng file (starts with
    /// bytes 0a 0d 0d 0a)".
    #[test]
    fn pcapng_cut_inside_its_section_header_is_cut_short() {
        for be in [false, true] {
            let mut w = NgWriter::new(be);
            w.interface(&[]);
            for keep in [4, 8, 12, 27] {
                let e = TraceReader::from_bytes("s.pcapng", w.out[..keep].to_vec())
                    .err()
                    .unwrap();
                assert!(
                    matches!(e, TraceError::Truncated { offset: 0, .. }),
                    "{keep}: {e}"
                );
            }
        }
    }

    /// A reader that hands out at most `chunk` bytes per read, as a pipe does.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn frames_of(mut r: TraceReader) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while let Some(f) = r.next_frame().unwrap() {
            v.push(f.data.to_vec());
        }
        v
    }

    /// A stream read a few bytes at a time (a pipe from `tcpdump -w -`) gives the frames a
    /// file gives: pcap, pcapng whose section header carries long options, and gzip of each.
    #[test]
    fn streams_read_in_small_pieces_give_the_same_frames() {
        let pcap = pcap_bytes(false, true, &[(1, 0, b"abcdef"), (2, 0, b"ghijkl")]);
        // a section header with a 300-byte comment, longer than any first read of a pipe
        let mut ng = NgWriter::new(true);
        ng.out.clear();
        let mut body = ng.u32(0x1a2b_3c4d);
        body.extend(ng.u16(1));
        body.extend(ng.u16(0));
        body.extend(ng.u64(u64::MAX));
        body.extend(ng.u16(1)); // opt_comment
        body.extend(ng.u16(300));
        body.extend([b'c'; 300]);
        body.extend([0; 4]);
        ng.block(0x0a0d_0d0a, &body);
        ng.interface(&[]);
        ng.enhanced_packet(0, 1, b"abc");
        ng.enhanced_packet(0, 2, b"defg");
        let mut inputs = vec![pcap, ng.out];
        for i in 0..2 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&inputs[i]).unwrap();
            inputs.push(gz.finish().unwrap());
        }
        for (i, bytes) in inputs.iter().enumerate() {
            let want = frames_of(TraceReader::from_bytes("f", bytes.clone()).unwrap());
            assert_eq!(want.len(), 2, "{i}");
            for chunk in [1, 3, 7, 4096] {
                let r = TraceReader::from_reader(
                    "standard input",
                    Box::new(Trickle {
                        data: bytes.clone(),
                        at: 0,
                        chunk,
                    }),
                )
                .unwrap_or_else(|e| panic!("{i}/{chunk}: {e}"));
                assert_eq!(r.file_size(), 0);
                assert_eq!(frames_of(r), want, "{i}/{chunk}");
            }
        }
        // an empty stream names its label
        let e = TraceReader::from_reader("standard input", Box::new(io::empty()))
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("standard input: empty"), "{e}");
    }

    /// pcap-parser reads `if_tsoffset` little-endian whatever the section's byte order, which
    /// put a big-endian file's frames out of the supported time range.
    #[test]
    fn pcapng_ts_offset_and_resolution_in_either_byte_order() {
        for be in [false, true] {
            let mut w = NgWriter::new(be);
            let offset = w.u64(1_600_000_000);
            w.interface(&[(9, vec![9]), (14, offset)]);
            w.enhanced_packet(0, 1_000_000 * 1_000_000_000 + 5, b"abc");
            let mut r = TraceReader::from_bytes(format!("o{be}.pcapng"), w.out).unwrap();
            let f = r.next_frame().unwrap().expect("frame skipped");
            assert_eq!(
                f.ts,
                Timestamp::from_nanos(1_601_000_000 * 1_000_000_000 + 5)
            );
            assert_eq!(f.data, b"abc");
            assert!(r.next_frame().unwrap().is_none());
            assert_eq!(r.stats.ts_out_of_range, 0);
        }
    }

    /// pcap-parser keeps an unknown block's type as read little-endian, so a big-endian
    /// section's Obsolete Packet Block (type 2) was passed over without a count.
    #[test]
    fn pcapng_obsolete_packet_block_in_either_byte_order() {
        for be in [false, true] {
            let mut w = NgWriter::new(be);
            w.interface(&[]);
            w.obsolete_packet(0, 1_600_000_000 * 1_000_000 + 7, b"abcdef");
            let mut r = TraceReader::from_bytes(format!("p{be}.pcapng"), w.out).unwrap();
            let f = r.next_frame().unwrap().expect("no frame");
            assert_eq!(
                f.ts,
                Timestamp::from_nanos(1_600_000_000 * 1_000_000_000 + 7_000)
            );
            assert_eq!(f.data, b"abcdef");
            assert_eq!(f.wire_len, 16);
            assert_eq!(f.link, LinkType::Ethernet);
            assert!(r.next_frame().unwrap().is_none());
            assert_eq!(r.stats.frames, 1);
        }
    }

    /// isb_ifdrop counts from the start of the capture, so a second statistics block for an
    /// interface replaces the first one's count; they were added up.
    #[test]
    fn interface_drops_are_the_last_count_of_each_interface() {
        for be in [false, true] {
            let mut w = NgWriter::new(be);
            w.interface(&[]);
            w.interface(&[]);
            w.enhanced_packet(0, 1, b"abc");
            w.interface_statistics(0, Some(3));
            w.interface_statistics(1, Some(2));
            w.interface_statistics(0, Some(5));
            w.interface_statistics(0, None);
            let mut r = TraceReader::from_bytes(format!("d{be}.pcapng"), w.out).unwrap();
            while r.next_frame().unwrap().is_some() {}
            assert_eq!(r.stats.if_dropped, 7);
        }
    }
}
