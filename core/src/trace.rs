//! Reading trace files: classic pcap (µs and ns, either byte order), pcapng (several sections
//! of either byte order, several interfaces each with its own link type, `if_tsresol` and
//! `if_tsoffset`; EPB, SPB and the obsolete OPB), and gzip-compressed copies of either.
//!
//! The block parsing is pcap-parser's; this module keeps the per-section interface table,
//! turns every timestamp into a [`Timestamp`], and reports what it could not use.
//!
//! A corrupt record does not end the reading. A pcapng block whose length field is plausible
//! but whose content is not is skipped by that length; one whose length cannot be right is
//! skipped up to the next offset where a block of a known type begins and ends with the same
//! length. A classic pcap record whose header no capture would write is skipped up to the next
//! offset where a plausible record header is followed by another (or by the end of the file).
//! The skips are counted in [`ReadStats`] and reported together once the input ends.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
/// How far apart (in seconds) two classic pcap records in a row may be stamped before the
/// second one's header is doubted (and checked against the record after it).
const MAX_GAP_SECS: u32 = 3600;
/// The largest pcapng block a resynchronization takes as the place to read on from.
const RESYNC_MAX_BLOCK: usize = 1 << 20;

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
    /// `content`: the offset is into a gzip file's decompressed content.
    #[error("{path}: file is cut short in the middle of a record at byte {offset}{}", if *.content { " of its decompressed content" } else { "" })]
    Truncated {
        path: PathBuf,
        offset: u64,
        content: bool,
    },
    /// A gzip stream that ends without its trailer where its content is between two records:
    /// every record it held was read; whatever followed is lost.
    #[error("{path}: the gzip stream is cut short (it ends without its trailer) after byte {offset} of its decompressed content, where a record ends: every record up to there was read, anything after is lost")]
    GzipCut { path: PathBuf, offset: u64 },
    /// The file ends inside its file header (classic pcap) or first section header (pcapng).
    #[error("{path}: file is cut short: {what}")]
    HeaderCut { path: PathBuf, what: String },
    /// A pcap or pcapng header of a version no reader of the format reads (libpcap reads pcap
    /// 2.x, Wireshark pcapng 1.x): most likely a damaged header, never guessed at.
    #[error("{path}: {what}")]
    UnsupportedVersion { path: PathBuf, what: String },
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
            TraceError::Truncated { .. }
            | TraceError::GzipCut { .. }
            | TraceError::HeaderCut { .. } => "file_truncated",
            TraceError::Corrupt { .. } => "corrupt_record",
            TraceError::UnsupportedVersion { .. } => "unsupported_version",
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
            | TraceError::GzipCut { path, .. }
            | TraceError::HeaderCut { path, .. }
            | TraceError::UnsupportedVersion { path, .. }
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
    /// Corrupt records (classic pcap records or pcapng blocks) skipped, the reading going on
    /// after them.
    pub corrupt_records: u64,
    /// Bytes passed over with them (the records, and what was scanned past to find the next).
    pub corrupt_bytes: u64,
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

impl Interface {
    /// A packet block's timestamp (in the interface's units since its offset), `None` out
    /// of range.
    #[inline]
    fn time(&self, units: u64) -> Option<Timestamp> {
        // beyond i64 seconds (a 1-unit-per-second interface stamped near 2^64): out of range
        let secs = i64::try_from(units / self.units_per_sec).ok()?;
        let frac = units % self.units_per_sec;
        secs.checked_add(self.offset_secs)
            .and_then(|s| Timestamp::from_parts(s, frac, self.units_per_sec))
    }
}

/// The first read error of the input, for the message that reports it (pcap-parser keeps only
/// that a read failed).
type ReadError = Arc<Mutex<Option<String>>>;

fn set_read_error(slot: &ReadError, what: String) {
    if let Ok(mut s) = slot.lock() {
        s.get_or_insert(what);
    }
}

struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
    error: ReadError,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.count.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Err(e) => {
                set_read_error(&self.error, e.to_string());
                Err(e)
            }
        }
    }
}

/// The input as read from the file: the bytes looked at to detect gzip, then the rest.
type RawInput = io::Chain<io::Cursor<Vec<u8>>, CountingReader<Box<dyn Read + Send>>>;

/// What the gzip layer found besides the content, shared with the reader.
#[derive(Default)]
struct GzipFindings {
    /// The stream ended inside a member: the file is cut short.
    cut: AtomicBool,
    /// What is wrong but lost no content: a member whose trailer does not match what it held,
    /// bytes after the last member that are not another member.
    notes: Mutex<Vec<String>>,
}

fn note(findings: &GzipFindings, what: String) {
    if let Ok(mut n) = findings.notes.lock() {
        n.push(what);
    }
}

/// Where a gzip member's reader stands in the file: the bytes read from it less those still
/// buffered.
fn file_pos(count: &AtomicU64, input: &BufReader<RawInput>) -> u64 {
    count
        .load(Ordering::Relaxed)
        .saturating_sub(input.buffer().len() as u64)
}

/// A gzip file read member after member. A stream cut off ends where it is cut, as a plain
/// file cut short does (`cut` says so; without it, a stream cut inside the first read buffer
/// failed the whole file). A member whose CRC32 or length trailer does not match, and bytes
/// after the last member that are not another member, are noted: they end nothing and lose no
/// content. Anything else (deflate data that does not decompress) is an error.
struct GzipMembers {
    member: Option<flate2::bufread::GzDecoder<BufReader<RawInput>>>,
    /// Where the current member starts in the file.
    start: u64,
    count: Arc<AtomicU64>,
    findings: Arc<GzipFindings>,
    error: ReadError,
    /// Set once the stream failed: every later read fails alike (a read ahead of a record
    /// that failed must not make the stream look ended).
    failed: Option<String>,
}

impl GzipMembers {
    /// After a member: the next member, the end of the file, or bytes that are not a member.
    fn next_member(&mut self) -> io::Result<()> {
        let Some(m) = self.member.take() else {
            return Ok(());
        };
        let mut input = m.into_inner();
        let end = file_pos(&self.count, &input);
        let head = input.fill_buf()?;
        if head.is_empty() {
            return Ok(());
        }
        if head[0] == 0x1f {
            let mut m = flate2::bufread::GzDecoder::new(input);
            if m.header().is_some() {
                self.start = end;
                self.member = Some(m);
                return Ok(());
            }
            match m.read(&mut [0u8; 1]) {
                // a member's header cut short: the file is
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.findings.cut.store(true, Ordering::Relaxed);
                    return Ok(());
                }
                _ => input = m.into_inner(),
            }
        }
        io::copy(&mut input, &mut io::sink())?;
        let junk = self.count.load(Ordering::Relaxed).saturating_sub(end);
        note(
            &self.findings,
            format!(
                "the {junk} bytes after the end of the gzip stream (from byte {end} of the \
                 file) are not another gzip member; they were ignored"
            ),
        );
        Ok(())
    }

    fn failed(&mut self, e: io::Error) -> io::Error {
        set_read_error(
            &self.error,
            format!(
                "corrupt gzip stream ({e}) in the gzip member starting at byte {} of the file; \
                 what follows cannot be decompressed",
                self.start
            ),
        );
        self.failed = Some(e.to_string());
        e
    }
}

impl Read for GzipMembers {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = &self.failed {
            return Err(io::Error::other(e.clone()));
        }
        while !buf.is_empty() {
            let Some(m) = self.member.as_mut() else {
                return Ok(0);
            };
            match m.read(buf) {
                Ok(0) => self.next_member().map_err(|e| self.failed(e))?,
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.findings.cut.store(true, Ordering::Relaxed);
                    self.member = None;
                    return Ok(0);
                }
                // flate2 checks the trailer once the member's content has all been handed out
                Err(e)
                    if e.kind() == io::ErrorKind::InvalidInput
                        && e.to_string().contains("checksum")
                        && m.header().is_some() =>
                {
                    let end = file_pos(&self.count, m.get_ref());
                    note(
                        &self.findings,
                        format!(
                            "the gzip member from byte {} to byte {end} of the file has a CRC32 \
                             or length trailer that does not match the content it held (all of \
                             that content was read, but it may be damaged)",
                            self.start
                        ),
                    );
                    self.next_member().map_err(|e| self.failed(e))?;
                }
                Err(e) => {
                    self.member = None;
                    return Err(self.failed(e));
                }
            }
        }
        Ok(0)
    }
}

/// A corrupt record the reader skipped, reading on after it.
#[derive(Debug, Clone)]
struct Skip {
    offset: u64,
    what: String,
    bytes: u64,
}

/// What the check of the record at the read position decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vet {
    /// Parse it.
    Read,
    /// It was corrupt and has been skipped: check what is now at the read position.
    Skipped,
}

/// Whether a resynchronization can read on from an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Yes,
    No,
    /// Cannot tell before this many bytes from the offset are in the buffer.
    More(usize),
}

/// What a pcapng block whose length cannot be right means when no block follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoResync {
    /// Its length runs past the end of the input: the file is cut short.
    Cut,
    /// Its length is beyond any block the reader accepts.
    Huge,
    Corrupt,
}

/// A classic pcap record header.
#[derive(Debug, Clone, Copy)]
struct RecordHeader {
    secs: u32,
    frac: u32,
    incl: u32,
    orig: u32,
}

impl RecordHeader {
    #[inline]
    fn at(d: &[u8], at: usize, big_endian: bool) -> Option<RecordHeader> {
        let b: &[u8; 16] = d.get(at..at.checked_add(16)?)?.try_into().ok()?;
        let f = |k: usize| [b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]];
        let (secs, frac, incl, orig) = if big_endian {
            (
                u32::from_be_bytes(f(0)),
                u32::from_be_bytes(f(1)),
                u32::from_be_bytes(f(2)),
                u32::from_be_bytes(f(3)),
            )
        } else {
            (
                u32::from_le_bytes(f(0)),
                u32::from_le_bytes(f(1)),
                u32::from_le_bytes(f(2)),
                u32::from_le_bytes(f(3)),
            )
        };
        Some(RecordHeader {
            secs,
            frac,
            incl,
            orig,
        })
    }
}

#[inline]
fn near(a: u32, b: u32) -> bool {
    a.abs_diff(b) <= MAX_GAP_SECS
}

/// One captured frame's place in the read buffer, with what the reader knows of it.
struct FrameAt {
    ts: Timestamp,
    link: LinkType,
    wire_len: u32,
    start: usize,
    len: usize,
    interface: u32,
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
    /// The seconds field of the last classic pcap record read.
    legacy_last_secs: Option<u32>,
    /// The most packet data a classic pcap record read so far held (a file's snaplen field
    /// can be less than its records hold).
    legacy_max_incl: u32,
    /// The input is pcapng (it starts with a Section Header Block).
    ng: bool,
    /// The length of the pcapng block at the read position, once checked (it is whole in the
    /// buffer then).
    vetted: Option<usize>,
    interfaces: Vec<Interface>,
    section_big_endian: bool,
    pending_consume: usize,
    last_ts: Timestamp,
    buffer_size: usize,
    bytes_read: Arc<AtomicU64>,
    file_size: u64,
    gzip: bool,
    /// A gzip stream cut short, a trailer that does not match, bytes after the stream.
    gzip_findings: Arc<GzipFindings>,
    read_error: ReadError,
    /// The first corrupt record skipped, and where the next few were.
    first_skip: Option<Skip>,
    later_skips: Vec<u64>,
    /// The reason of the error that ended the reading after corrupt records were skipped
    /// (reported inside their [`TraceError::Corrupt`]).
    fatal_after_skips: Option<&'static str>,
    /// The end of the input, or an error past which nothing can be read, has been reported.
    finished: bool,
    warnings: Vec<String>,
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
        let read_error = ReadError::default();
        let mut counted = CountingReader {
            inner: input,
            count: bytes_read.clone(),
            error: read_error.clone(),
        };
        let mut magic = [0u8; 2];
        let n = read_up_to(&mut counted, &mut magic).map_err(io_err)?;
        if n == 0 {
            return Err(TraceError::Empty { path });
        }
        let gzip = magic[..n] == [0x1f, 0x8b];
        let raw = io::Cursor::new(magic[..n].to_vec()).chain(counted);
        let findings = Arc::new(GzipFindings::default());
        let mut source: Box<dyn Read + Send> = if gzip {
            Box::new(GzipMembers {
                member: Some(flate2::bufread::GzDecoder::new(BufReader::with_capacity(
                    1 << 16,
                    raw,
                ))),
                start: 0,
                count: bytes_read.clone(),
                findings: findings.clone(),
                error: read_error.clone(),
                failed: None,
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
        let cut = findings.cut.load(Ordering::Relaxed);
        if head.is_empty() {
            // a gzip stream of nothing, or cut before its first byte of content
            return Err(if cut {
                TraceError::Truncated {
                    path,
                    offset: 0,
                    content: true,
                }
            } else {
                TraceError::Empty { path }
            });
        }
        let ng = head.starts_with(&PCAPNG_SHB);
        let source: Box<dyn Read + Send> = Box::new(io::Cursor::new(head.clone()).chain(source));
        let inner = match create_reader(INITIAL_BUFFER, source) {
            Ok(r) => r,
            Err(PcapError::Eof) if cut => {
                return Err(TraceError::Truncated {
                    path,
                    offset: 0,
                    content: true,
                })
            }
            Err(PcapError::Eof) => return Err(TraceError::Empty { path }),
            Err(PcapError::Incomplete(_)) | Err(PcapError::UnexpectedEof) => {
                return Err(header_cut(path, &head, gzip))
            }
            Err(PcapError::ReadError) => {
                let what = read_error.lock().ok().and_then(|e| e.clone());
                return Err(TraceError::Io {
                    path,
                    source: io::Error::other(
                        what.unwrap_or_else(|| "read failed (corrupt gzip stream?)".into()),
                    ),
                });
            }
            // a pcapng section header that the input ends inside (pcap-parser calls it
            // unrecognized): the file is cut short, not something else
            Err(_) if ng && shb_cut_short(&head) => return Err(header_cut(path, &head, gzip)),
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
        if let Some(what) = unsupported_version(&head) {
            return Err(TraceError::UnsupportedVersion { path, what });
        }
        Ok(TraceReader {
            path,
            inner,
            format: None,
            legacy_link: LinkType::Unknown(u32::MAX),
            legacy_units: 1_000_000,
            legacy_snaplen: 0,
            legacy_record_header: 16,
            legacy_last_secs: None,
            legacy_max_incl: 0,
            ng,
            vetted: None,
            interfaces: Vec::new(),
            section_big_endian: false,
            pending_consume: 0,
            last_ts: Timestamp::ZERO,
            buffer_size: INITIAL_BUFFER,
            bytes_read,
            file_size,
            gzip,
            gzip_findings: findings,
            read_error,
            first_skip: None,
            later_skips: Vec::new(),
            fatal_after_skips: None,
            finished: false,
            warnings: Vec::new(),
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
    /// What was wrong with the input but lost no frame (a gzip trailer that does not match its
    /// content, bytes after the gzip stream), each naming the file; logged as warnings too.
    /// Complete once [`Self::next_frame`] has reported the end of the input.
    /// When the reading skipped corrupt records and then met an error it could not read past
    /// (a file cut short, a read that failed), that error's reason ([`TraceError::reason`]):
    /// the input ended early although its [`TraceError::Corrupt`] report is about the skips.
    pub fn ended_early_after_skips(&self) -> Option<&'static str> {
        self.fatal_after_skips
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    fn position(&self) -> u64 {
        self.inner.consumed() as u64
    }

    fn gzip_cut(&self) -> bool {
        self.gzip_findings.cut.load(Ordering::Relaxed)
    }

    /// The next frame, `Ok(None)` at the end of the file.
    ///
    /// A corrupt record is skipped (see the module's documentation) and the reading goes on;
    /// once the input ends, the skips are reported as one [`TraceError::Corrupt`] naming the
    /// first (where it was, what was wrong, how many bytes were skipped and where the reading
    /// resumed) and counting the others: every frame after them has been returned by then.
    /// Any other error ends the reading; frames returned before it remain valid. After an
    /// error, or the end, the reader returns `Ok(None)`.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, TraceError> {
        if self.finished {
            return Ok(None);
        }
        let at = match self.read_next() {
            Ok(Some(at)) => at,
            Ok(None) => {
                self.finished = true;
                self.report_warnings();
                return match self.skips_error(None) {
                    Some(e) => Err(e),
                    None => Ok(None),
                };
            }
            Err(e) => {
                self.finished = true;
                self.report_warnings();
                return Err(self.skips_error(Some(&e)).unwrap_or(e));
            }
        };
        let data = &self.inner.data()[at.start..at.start + at.len];
        Ok(Some(Frame {
            ts: at.ts,
            link: at.link,
            wire_len: at.wire_len,
            data,
            interface: at.interface,
        }))
    }

    /// The gzip layer's notes, logged and kept (once the input has ended).
    fn report_warnings(&mut self) {
        let notes = match self.gzip_findings.notes.lock() {
            Ok(mut n) => std::mem::take(&mut *n),
            Err(_) => Vec::new(),
        };
        for n in notes {
            let w = format!("{}: {n}", self.path.display());
            // the reader's user says it (`mimic analyze`'s warnings, capture's log)
            tracing::debug!("{w}");
            self.warnings.push(w);
        }
    }

    /// The error that reports the corrupt records skipped, if any was (with `fatal`, what
    /// ended the reading after them).
    fn skips_error(&mut self, fatal: Option<&TraceError>) -> Option<TraceError> {
        let first = self.first_skip.take()?;
        let mut what = format!(
            "{}; skipped {} bytes, reading resumed at byte {}",
            first.what,
            first.bytes,
            first.offset + first.bytes
        );
        let more = self.stats.corrupt_records.saturating_sub(1);
        if more > 0 {
            let at: Vec<String> = self.later_skips.iter().map(|o| o.to_string()).collect();
            let etc = if more > at.len() as u64 { ", …" } else { "" };
            let s = if more == 1 { "" } else { "s" };
            what += &format!(
                "; {more} more corrupt record{s} skipped after it (at byte{s} {}{etc}), {} \
                 bytes skipped in all",
                at.join(", "),
                self.stats.corrupt_bytes
            );
        }
        if let Some(e) = fatal {
            let msg = e.to_string();
            let prefix = format!("{}: ", self.path.display());
            what += &format!("; then {}", msg.strip_prefix(&prefix).unwrap_or(&msg));
            self.fatal_after_skips = Some(e.reason());
        }
        Some(TraceError::Corrupt {
            path: self.path.clone(),
            offset: first.offset,
            what,
        })
    }

    /// Counts a corrupt record of `bytes` bytes (what was scanned past included) at `offset`.
    fn record_skip(&mut self, offset: u64, what: String, bytes: u64) {
        self.stats.corrupt_records += 1;
        self.stats.corrupt_bytes += bytes;
        tracing::debug!(
            "{}: corrupt record at byte {offset}: {what}; skipped {bytes} bytes",
            self.path.display()
        );
        if self.first_skip.is_none() {
            self.first_skip = Some(Skip {
                offset,
                what,
                bytes,
            });
        } else if self.later_skips.len() < 3 {
            self.later_skips.push(offset);
        }
    }

    fn read_next(&mut self) -> Result<Option<FrameAt>, TraceError> {
        if self.pending_consume > 0 {
            self.inner.consume_noshift(self.pending_consume);
            self.pending_consume = 0;
        }
        loop {
            if let Some(at) = self.plain_record().or_else(|| self.plain_block()) {
                return Ok(Some(at));
            }
            if self.inner.data().is_empty() && self.inner.reader_exhausted() {
                // everything read (pcap-parser would call a buffer read to its end cut short)
                if self.gzip_cut() {
                    return Err(self.gzip_cut_between_records());
                }
                return Ok(None);
            }
            if self.vet()? == Vet::Skipped {
                continue;
            }
            let step = match self.inner.next() {
                Ok((offset, block)) => {
                    classify(offset, block, &mut self.format, self.section_big_endian)
                }
                Err(PcapError::Eof) if self.gzip_findings.cut.load(Ordering::Relaxed) => {
                    // cut between two records: still a file cut short
                    return Err(self.gzip_cut_between_records());
                }
                Err(PcapError::Eof) => return Ok(None),
                // the whole block is in the buffer: what it holds does not fit in it
                Err(
                    PcapError::Incomplete(_) | PcapError::UnexpectedEof | PcapError::BufferTooSmall,
                ) if self.vetted.is_some() => {
                    let what = "its content does not fit in its length".to_string();
                    self.skip_vetted_block(what);
                    continue;
                }
                Err(PcapError::Incomplete(_)) => {
                    let before = self.inner.data().len();
                    if self.inner.refill().is_err() {
                        return Err(self.read_failed());
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
                        return Err(self.read_failed());
                    }
                    continue;
                }
                Err(PcapError::UnexpectedEof) => return Err(self.truncated()),
                Err(PcapError::ReadError) => return Err(self.read_failed()),
                Err(e) => {
                    let what = match e {
                        PcapError::HeaderNotRecognized => "block header not recognized".to_string(),
                        PcapError::NomError(_, kind) => format!("unparseable block ({kind:?})"),
                        PcapError::OwnedNomError(_, kind) => {
                            format!("unparseable block ({kind:?})")
                        }
                        other => format!("{other:?}"),
                    };
                    if self.vetted.is_some() {
                        self.skip_vetted_block(what);
                        continue;
                    }
                    if let Some(Format::Pcap { big_endian, .. }) = self.format {
                        let pos = self.position();
                        self.resync_record(pos, what, NoResync::Corrupt, big_endian)?;
                        continue;
                    }
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
                Step::Section {
                    offset,
                    big_endian,
                    version: (major, minor),
                } => {
                    // the first section's was checked with the file header; a later one of
                    // another version ends the reading there, as in Wireshark
                    if let Some(v) = section_version_problem(major, minor) {
                        return Err(TraceError::UnsupportedVersion {
                            path: self.path.clone(),
                            what: format!(
                                "pcapng section header at byte {} of {v}",
                                self.position()
                            ),
                        });
                    }
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
                Step::Packet(p) => {
                    if let Some(at) = self.packet(p) {
                        return Ok(Some(at));
                    }
                }
            }
        }
    }

    /// The frame of a packet record or block, or `None` when it is passed over (counted in
    /// [`ReadStats`], consumed).
    #[inline]
    fn packet(&mut self, p: PacketAt) -> Option<FrameAt> {
        let PacketAt {
            offset,
            ts,
            iface,
            wire_len,
            data_ptr,
            data_len,
        } = p;
        let (link, ts) = match ts {
            RawTs::Legacy { secs, frac } => {
                if frac as u64 >= self.legacy_units {
                    self.stats.ts_invalid_fraction += 1;
                }
                (self.legacy_link, self.legacy_seen(secs, frac, data_len))
            }
            RawTs::Ng(units) => match self.interfaces.get(iface as usize) {
                Some(i) => (i.link, i.time(units)),
                None => {
                    self.stats.unknown_interface += 1;
                    self.inner.consume_noshift(offset);
                    return None;
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
                    return None;
                }
            },
        };
        let Some(ts) = ts else {
            self.stats.ts_out_of_range += 1;
            self.inner.consume_noshift(offset);
            return None;
        };
        // Locate the packet bytes in the (still unconsumed) buffer.
        let buf = self.inner.data();
        let start = data_ptr.wrapping_sub(buf.as_ptr() as usize);
        if start
            .checked_add(data_len)
            .is_none_or(|end| end > buf.len() || end > offset)
        {
            let pos = self.position();
            let what = "packet data outside its block".to_string();
            self.record_skip(pos, what, offset as u64);
            self.inner.consume_noshift(offset);
            return None;
        }
        let frame = FrameAt {
            ts,
            link,
            wire_len,
            start,
            len: data_len,
            interface: iface,
        };
        Some(self.accept(offset, frame))
    }

    /// `frame`, of the record or block at the read position (`offset` bytes long), counted
    /// and to be consumed at the next call.
    #[inline(always)]
    fn accept(&mut self, offset: usize, frame: FrameAt) -> FrameAt {
        self.last_ts = frame.ts;
        self.stats.frames += 1;
        self.pending_consume = offset;
        frame
    }

    /// A classic pcap record read without pcap-parser, the common case: a 16-byte record header
    /// and the header after the record both in the buffer and plausible
    /// ([`Self::plausible_record`]), so that the general path ([`Self::vet_record`], then the
    /// parser) would read it as it is, the same frame. `None` leaves the record to that path.
    /// (pcap-parser reads the "modified" format's 24-byte headers little-endian whatever the
    /// file's byte order: those it parses itself, as before.)
    #[inline]
    fn plain_record(&mut self) -> Option<FrameAt> {
        let Some(Format::Pcap { big_endian, .. }) = self.format else {
            return None;
        };
        if self.ng || self.legacy_record_header != 16 {
            return None;
        }
        let d = self.inner.data();
        let h = RecordHeader::at(d, 0, big_endian)?;
        let end = 16 + h.incl as usize;
        let next = RecordHeader::at(d, end, big_endian)?;
        if !(self.plausible_record(&h, self.legacy_last_secs)
            && self.plausible_record(&next, Some(h.secs)))
        {
            return None;
        }
        // what [`Self::packet`] does with a record, for the one kind this path takes
        let Some(ts) = self.legacy_seen(h.secs, h.frac, h.incl as usize) else {
            self.stats.ts_out_of_range += 1;
            self.inner.consume_noshift(end);
            // the next record goes the general way
            return None;
        };
        let frame = FrameAt {
            ts,
            link: self.legacy_link,
            wire_len: h.orig,
            start: 16,
            len: h.incl as usize,
            interface: 0,
        };
        Some(self.accept(end, frame))
    }

    /// An Enhanced Packet Block read without a second look, the common case of pcapng: the
    /// block whole in the buffer, every check [`Self::vet_block`] makes of it passed, of an
    /// interface the section described and stamped within range, so that the general path
    /// (`vet_block`, then pcap-parser) would return the same frame. `None` leaves the
    /// block to that path.
    #[inline]
    fn plain_block(&mut self) -> Option<FrameAt> {
        if !self.ng {
            return None;
        }
        let big_endian = self.section_big_endian;
        let d = self.inner.data();
        let head: &[u8; 28] = d.get(..28)?.try_into().ok()?;
        let w = |i: usize| u32_in([head[i], head[i + 1], head[i + 2], head[i + 3]], big_endian);
        let len = w(4) as usize;
        let caplen = w(20) as usize;
        if w(0) != 6
            || !len.is_multiple_of(4)
            || !(32..MAX_BUFFER).contains(&len)
            || caplen > len - 32
        {
            return None;
        }
        let trailer: [u8; 4] = d.get(len - 4..len)?.try_into().ok()?;
        if u32_in(trailer, big_endian) as usize != len {
            return None;
        }
        let iface = w(8);
        let i = self.interfaces.get(iface as usize)?;
        let ts = i.time((w(12) as u64) << 32 | w(16) as u64)?;
        let frame = FrameAt {
            ts,
            link: i.link,
            wire_len: w(24),
            start: 28,
            len: caplen,
            interface: iface,
        };
        Some(self.accept(len, frame))
    }

    /// What reading a classic pcap record notes of it (its seconds, for the check of the next
    /// record; the most data a record held); its timestamp, `None` out of range.
    #[inline]
    fn legacy_seen(&mut self, secs: u32, frac: u32, data_len: usize) -> Option<Timestamp> {
        self.legacy_last_secs = Some(secs);
        self.legacy_max_incl = self.legacy_max_incl.max(data_len as u32);
        Timestamp::from_parts(secs as i64, frac as u64, self.legacy_units)
    }

    /// Makes the buffer hold at least `need` bytes from the read position (at most
    /// [`MAX_BUFFER`]), growing it if it must; `false` when the input ends before.
    fn fill(&mut self, need: usize) -> Result<bool, TraceError> {
        let need = need.min(MAX_BUFFER);
        while self.inner.data().len() < need {
            if self.inner.reader_exhausted() {
                return Ok(false);
            }
            if need > self.buffer_size {
                self.buffer_size = need.next_power_of_two().min(MAX_BUFFER);
                self.inner.grow(self.buffer_size);
            }
            if self.inner.refill().is_err() {
                return Err(self.read_failed());
            }
        }
        Ok(true)
    }

    /// [`Self::fill`] for a look ahead of the record at the read position: a read that fails
    /// is `false` (the record is read; the failure is reported when the reading gets there).
    fn fill_ahead(&mut self, need: usize) -> bool {
        self.fill(need).unwrap_or(false)
    }

    /// The error for a read that failed: what the input said, when it said something.
    fn read_failed(&self) -> TraceError {
        let what = self.read_error.lock().ok().and_then(|e| e.clone());
        TraceError::Io {
            path: self.path.clone(),
            source: io::Error::other(
                what.unwrap_or_else(|| "read failed (corrupt gzip stream?)".into()),
            ),
        }
    }

    /// Checks the record at the read position before pcap-parser parses it; a corrupt one is
    /// skipped.
    #[inline]
    fn vet(&mut self) -> Result<Vet, TraceError> {
        self.vetted = None;
        if self.ng {
            return self.vet_block();
        }
        match self.format {
            Some(Format::Pcap { big_endian, .. }) => self.vet_record(big_endian),
            _ => Ok(Vet::Read),
        }
    }

    /// A classic pcap record is read when its header is one a capture could have written. One
    /// that is merely unusual (more than the snaplen, more captured than sent, an hour or more
    /// from the frame before) is read when the record after it is plausible too, or when the
    /// file ends with it. Anything else is skipped up to the next plausible record.
    fn vet_record(&mut self, big_endian: bool) -> Result<Vet, TraceError> {
        let hdr = self.legacy_record_header;
        // The common case, without a fill or a message: this record and the header after it
        // are in the buffer and both plausible (each test here implies the slow path's own).
        {
            let d = self.inner.data();
            if let Some(h) = RecordHeader::at(d, 0, big_endian) {
                let body = hdr + h.incl as usize;
                if self.plausible_record(&h, self.legacy_last_secs)
                    && RecordHeader::at(d, body, big_endian)
                        .is_some_and(|n| self.plausible_record(&n, Some(h.secs)))
                {
                    return Ok(Vet::Read);
                }
            }
        }
        if !self.fill(hdr)? {
            // the end, or a record header cut short: the parser says which
            return Ok(Vet::Read);
        }
        let pos = self.position();
        let Some(h) = RecordHeader::at(self.inner.data(), 0, big_endian) else {
            return Ok(Vet::Read);
        };
        let body = hdr + h.incl as usize;
        let (what, end) = if let Some(what) = self.record_length_problem(h.incl) {
            (what, NoResync::Huge)
        } else if !self.fill(body)? {
            // cut short, or a length gone wrong: cut short unless a plausible record follows
            let left = self.inner.data().len() - hdr;
            let what = self
                .record_doubt(&h, self.legacy_last_secs)
                .unwrap_or_else(|| {
                    format!(
                    "record claims {} bytes of packet data, more than the {left} bytes left in \
                     the file",
                    h.incl
                )
                });
            (what, NoResync::Cut)
        } else if let Some(doubt) = self.record_doubt(&h, self.legacy_last_secs) {
            if !self.fill_ahead(body + hdr) {
                // the file ends with it (or cuts the record after it short: the parser says so)
                return Ok(Vet::Read);
            }
            let next = RecordHeader::at(self.inner.data(), body, big_endian);
            if next.is_some_and(|n| {
                n.incl > 0 && self.record_length_problem(n.incl).is_none() && near(n.secs, h.secs)
            }) {
                return Ok(Vet::Read);
            }
            (doubt, NoResync::Corrupt)
        } else {
            // a plausible header, but one whose length may have gone wrong: when the header
            // after the record is not plausible, a plausible record starting inside it says so
            if !self.fill_ahead(body + hdr) {
                return Ok(Vet::Read);
            }
            let next = RecordHeader::at(self.inner.data(), body, big_endian).expect("filled");
            if self.record_length_problem(next.incl).is_none()
                && self.record_doubt(&next, Some(h.secs)).is_none()
            {
                return Ok(Vet::Read);
            }
            let Some(at) = self.resync_point_within(body, big_endian)? else {
                return Ok(Vet::Read);
            };
            let what = format!(
                "record claims {} bytes of packet data, but the header after them is not \
                 plausible and a plausible record starts {at} bytes into it",
                h.incl
            );
            self.record_skip(pos, what, at as u64);
            self.inner.consume_noshift(at);
            return Ok(Vet::Skipped);
        };
        self.resync_record(pos, what, end, big_endian)
            .map(|()| Vet::Skipped)
    }

    /// What makes a classic pcap record's length impossible, if anything: more than libpcap
    /// accepts whatever the snaplen, or more than this reader holds.
    fn record_length_problem(&self, caplen: u32) -> Option<String> {
        let snaplen = self.legacy_snaplen;
        if caplen > snaplen.max(MAX_SNAPLEN) {
            let limit = if snaplen >= MAX_SNAPLEN {
                format!("the snaplen of {snaplen} allows")
            } else {
                format!("libpcap accepts ({MAX_SNAPLEN}; the snaplen is {snaplen})")
            };
            Some(format!(
                "record claims {caplen} bytes of packet data, more than {limit}"
            ))
        } else if caplen as usize >= MAX_BUFFER - 2 * self.legacy_record_header {
            Some(format!(
                "record claims {caplen} bytes of packet data, more than the largest record \
                 accepted ({} MiB)",
                MAX_BUFFER >> 20
            ))
        } else {
            None
        }
    }

    /// What makes a classic pcap record header doubtful, if anything (`prev`: the seconds of
    /// the record before it).
    fn record_doubt(&self, h: &RecordHeader, prev: Option<u32>) -> Option<String> {
        let snaplen = self.legacy_snaplen;
        if h.incl == 0 {
            // as a run of zeros reads
            Some("record holds no packet data".to_string())
        } else if (1..=MAX_SNAPLEN).contains(&snaplen) && h.incl > snaplen.max(self.legacy_max_incl)
        {
            Some(format!(
                "record claims {} bytes of packet data, more than the snaplen of {snaplen}",
                h.incl
            ))
        } else if h.incl > h.orig {
            Some(format!(
                "record claims {} bytes captured of a {}-byte packet",
                h.incl, h.orig
            ))
        } else {
            let last = prev.filter(|&l| !near(h.secs, l))?;
            Some(format!(
                "record is stamped {} s away from the frame before it",
                h.secs.abs_diff(last)
            ))
        }
    }

    /// Whether a classic pcap record header is one to read on from: lengths within the
    /// snaplen (or the most a record held before; 256 KiB without a sane snaplen), at least one byte captured and no more than the
    /// packet's length, a valid sub-second field, and (given `prev`) a timestamp within an hour
    /// of it.
    #[inline]
    fn plausible_record(&self, h: &RecordHeader, prev: Option<u32>) -> bool {
        let snaplen = self.legacy_snaplen;
        let limit = if (1..=MAX_SNAPLEN).contains(&snaplen) {
            snaplen.max(self.legacy_max_incl)
        } else {
            MAX_SNAPLEN
        };
        h.incl >= 1
            && h.incl <= limit
            && h.orig >= h.incl
            && (h.orig as usize) < MAX_BUFFER
            && (h.frac as u64) < self.legacy_units
            && prev.is_none_or(|p| near(h.secs, p))
    }

    /// Whether `n` plausible classic pcap records follow each other from `i` (each stamped
    /// near the one before it, the first near `prev` if given); the file ending after one of
    /// them ends the chain well.
    fn record_chain(
        &self,
        d: &[u8],
        i: usize,
        exhausted: bool,
        big_endian: bool,
        n: usize,
        mut prev: Option<u32>,
    ) -> Probe {
        let hdr = self.legacy_record_header;
        let mut at = i;
        for k in 0..n {
            if k > 0 && exhausted && at == d.len() {
                return Probe::Yes;
            }
            let Some(h) = RecordHeader::at(d, at, big_endian) else {
                return if exhausted {
                    Probe::No
                } else {
                    Probe::More(at + hdr - i)
                };
            };
            if !self.plausible_record(&h, prev) {
                return Probe::No;
            }
            prev = Some(h.secs);
            at += hdr + h.incl as usize;
            if k + 1 == n {
                break;
            }
            if at > d.len() {
                return if exhausted {
                    Probe::No
                } else {
                    Probe::More(at + hdr - i)
                };
            }
        }
        Probe::Yes
    }

    /// Whether the reading can go on from offset `i` of `d` after a corrupt classic pcap
    /// record: a plausible record stamped within an hour of the last frame read and followed
    /// by another, or (whatever its time) followed by two more.
    fn probe_record(&self, d: &[u8], i: usize, exhausted: bool, big_endian: bool) -> Probe {
        if let Some(last) = self.legacy_last_secs {
            match self.record_chain(d, i, exhausted, big_endian, 2, Some(last)) {
                Probe::No => {}
                p => return p,
            }
        }
        self.record_chain(d, i, exhausted, big_endian, 3, None)
    }

    /// The first offset from 1 to `len` (exclusive) after the read position that the reading
    /// could go on from after a corrupt classic pcap record, without moving the read position.
    fn resync_point_within(
        &mut self,
        len: usize,
        big_endian: bool,
    ) -> Result<Option<usize>, TraceError> {
        let mut i = 1;
        while i < len {
            let exhausted = self.inner.reader_exhausted();
            let d = self.inner.data();
            let have = d.len();
            match self.probe_record(d, i, exhausted, big_endian) {
                Probe::Yes => return Ok(Some(i)),
                Probe::No => i += 1,
                Probe::More(need) if i + need <= have || i + need > MAX_BUFFER => i += 1,
                Probe::More(need) => {
                    if !self.fill_ahead(i + need) && !self.inner.reader_exhausted() {
                        return Ok(None);
                    }
                }
            }
        }
        Ok(None)
    }

    /// Skips the corrupt classic pcap record at the read position (`pos`) up to the next
    /// offset the reading can go on from; an error when there is none before the end.
    fn resync_record(
        &mut self,
        pos: u64,
        what: String,
        end: NoResync,
        big_endian: bool,
    ) -> Result<(), TraceError> {
        let found = self.scan(|r, d, i, ex| r.probe_record(d, i, ex, big_endian))?;
        let skipped = self.position() - pos;
        if found {
            self.record_skip(pos, what, skipped);
            return Ok(());
        }
        let path = self.path.clone();
        Err(match end {
            NoResync::Cut => TraceError::Truncated {
                path,
                offset: pos,
                content: self.gzip,
            },
            NoResync::Huge => {
                let left = skipped.saturating_sub(self.legacy_record_header as u64);
                TraceError::Corrupt {
                    path,
                    offset: pos,
                    what: format!(
                        "{what} (the file holds {left} more bytes, with no plausible record in \
                         them)"
                    ),
                }
            }
            NoResync::Corrupt => TraceError::Corrupt {
                path,
                offset: pos,
                what: format!(
                    "{what}; no plausible record follows it in the {skipped} bytes to the end"
                ),
            },
        })
    }

    /// A pcapng block is read when its length is plausible (a multiple of 4, at least 12,
    /// within the input) and its trailing length and fixed fields agree with it. One whose
    /// content is wrong is skipped by its length; one whose length is wrong up to the next
    /// block of a known type whose two lengths agree.
    fn vet_block(&mut self) -> Result<Vet, TraceError> {
        if !self.fill(12)? {
            // the end, or less than any block: the parser says which
            return Ok(Vet::Read);
        }
        let pos = self.position();
        let head: [u8; 12] = self.inner.data()[..12].try_into().expect("filled");
        let shb = head[..4] == PCAPNG_SHB;
        let big_endian = if shb {
            match head[8..12] {
                [0x1a, 0x2b, 0x3c, 0x4d] => true,
                [0x4d, 0x3c, 0x2b, 0x1a] => false,
                _ => {
                    let what = format!(
                        "section header block with an unknown byte-order magic ({})",
                        describe_bytes(&head[8..12])
                    );
                    return self.resync_block(pos, what, NoResync::Corrupt);
                }
            }
        } else {
            self.section_big_endian
        };
        let word = |at: usize| u32_in(head[at..at + 4].try_into().expect("4 bytes"), big_endian);
        let block_type = word(0);
        let len = word(4) as usize;
        let name = block_name(block_type);
        let problem = if !len.is_multiple_of(4) {
            Some((
                format!("{name} claims {len} bytes, not a multiple of 4"),
                NoResync::Corrupt,
            ))
        } else if len < 12 {
            Some((
                format!("{name} claims {len} bytes, fewer than any block holds (12)"),
                NoResync::Corrupt,
            ))
        } else if len >= MAX_BUFFER {
            Some((
                format!(
                    "{name} claims {len} bytes, more than the largest block accepted ({} MiB)",
                    MAX_BUFFER >> 20
                ),
                NoResync::Huge,
            ))
        } else if !self.fill(len)? {
            Some((
                format!(
                    "{name} claims {len} bytes, more than the {} bytes left in the file",
                    self.inner.data().len()
                ),
                NoResync::Cut,
            ))
        } else {
            None
        };
        if let Some((what, end)) = problem {
            return self.resync_block(pos, what, end);
        }
        let d = &self.inner.data()[..len];
        let trailer = u32_in(d[len - 4..].try_into().expect("4 bytes"), big_endian) as usize;
        if trailer != len {
            let what = format!(
                "{name}'s trailing length ({trailer}) differs from its leading one ({len})"
            );
            // the leading length is taken when a block starts where it ends
            return if self.block_starts_at(len, big_endian) {
                Ok(self.skip_block(pos, what, len))
            } else {
                self.resync_block(pos, what, NoResync::Corrupt)
            };
        }
        if let Some(what) = block_body_problem(block_type, d, big_endian) {
            return Ok(self.skip_block(pos, what, len));
        }
        self.vetted = Some(len);
        Ok(Vet::Read)
    }

    /// Whether a pcapng block of a known type and a plausible length starts `at` bytes from
    /// the read position, or the input ends there.
    fn block_starts_at(&mut self, at: usize, big_endian: bool) -> bool {
        if !self.fill(at + 8).unwrap_or(true) {
            return self.inner.data().len() == at;
        }
        let Some(d) = self.inner.data().get(at..at + 8) else {
            // a read that failed: the failure is reported when the reading gets there
            return true;
        };
        if d[..4] == PCAPNG_SHB {
            return true;
        }
        let block_type = u32_in(d[..4].try_into().expect("4 bytes"), big_endian);
        let len = u32_in(d[4..].try_into().expect("4 bytes"), big_endian);
        KNOWN_BLOCKS.contains(&block_type) && len.is_multiple_of(4) && len >= 12
    }

    /// Counts the block at the read position (at `pos`, `len` bytes, whole in the buffer) as
    /// corrupt and skips it.
    fn skip_block(&mut self, pos: u64, what: String, len: usize) -> Vet {
        self.record_skip(pos, what, len as u64);
        self.inner.consume_noshift(len);
        Vet::Skipped
    }

    /// Skips the checked block at the read position that pcap-parser could not parse.
    fn skip_vetted_block(&mut self, what: String) {
        let Some(len) = self.vetted.take() else {
            return;
        };
        let pos = self.position();
        let d = self.inner.data();
        let big_endian = if d.get(..4) == Some(&PCAPNG_SHB[..]) {
            d.get(8..12) == Some(&[0x1a, 0x2b, 0x3c, 0x4d][..])
        } else {
            self.section_big_endian
        };
        let name = d
            .get(..4)
            .map(|t| block_name(u32_in(t.try_into().expect("4 bytes"), big_endian)))
            .unwrap_or_else(|| "block".into());
        self.skip_block(pos, format!("{name}: {what}"), len.min(d.len()));
    }

    /// Skips the pcapng block at the read position (`pos`), whose length cannot be trusted, up
    /// to the next block of a known type whose two lengths agree; an error when there is none
    /// before the end.
    fn resync_block(&mut self, pos: u64, what: String, end: NoResync) -> Result<Vet, TraceError> {
        let found = self.scan(|r, d, i, ex| r.probe_block(d, i, ex))?;
        let skipped = self.position() - pos;
        if found {
            self.record_skip(pos, what, skipped);
            return Ok(Vet::Skipped);
        }
        let path = self.path.clone();
        Err(match end {
            NoResync::Cut => TraceError::Truncated {
                path,
                offset: pos,
                content: self.gzip,
            },
            NoResync::Huge => TraceError::Corrupt {
                path,
                offset: pos,
                what: format!(
                    "{what} (the file holds {} more bytes)",
                    skipped.saturating_sub(8)
                ),
            },
            NoResync::Corrupt => TraceError::Corrupt {
                path,
                offset: pos,
                what: format!(
                    "{what}; no valid block follows it in the {skipped} bytes to the end"
                ),
            },
        })
    }

    /// Whether a pcapng block of a known type starts at offset `i` of `d`, with a length the
    /// reader takes, a trailing length equal to it, and fixed fields that fit.
    fn probe_block(&self, d: &[u8], i: usize, exhausted: bool) -> Probe {
        let more = |n: usize| {
            if exhausted {
                Probe::No
            } else {
                Probe::More(n)
            }
        };
        let Some(head) = d.get(i..i + 12) else {
            return more(12);
        };
        let big_endian = if head[..4] == PCAPNG_SHB {
            match head[8..12] {
                [0x1a, 0x2b, 0x3c, 0x4d] => true,
                [0x4d, 0x3c, 0x2b, 0x1a] => false,
                _ => return Probe::No,
            }
        } else {
            self.section_big_endian
        };
        let word = |at: usize| u32_in(head[at..at + 4].try_into().expect("4 bytes"), big_endian);
        let block_type = word(0);
        let len = word(4) as usize;
        if !KNOWN_BLOCKS.contains(&block_type)
            || !len.is_multiple_of(4)
            || !(12..=RESYNC_MAX_BLOCK).contains(&len)
        {
            return Probe::No;
        }
        let Some(block) = d.get(i..i + len) else {
            return more(len);
        };
        let trailer = u32_in(block[len - 4..].try_into().expect("4 bytes"), big_endian);
        if trailer as usize != len || block_body_problem(block_type, block, big_endian).is_some() {
            return Probe::No;
        }
        Probe::Yes
    }

    /// Looks for the next offset after the read position from which `probe` says the reading
    /// can go on, and moves the read position there (`true`), or to the end of the input
    /// (`false`). The bytes passed over are consumed as the scan goes, so the buffer holds no
    /// more than the probe needs.
    fn scan(
        &mut self,
        probe: impl Fn(&Self, &[u8], usize, bool) -> Probe,
    ) -> Result<bool, TraceError> {
        // offset 0 is the corrupt record
        let mut i = 1;
        loop {
            let exhausted = self.inner.reader_exhausted();
            let d = self.inner.data();
            let have = d.len();
            if i >= have {
                self.inner.consume_noshift(have);
                if exhausted || !self.fill(1)? {
                    return Ok(false);
                }
                i = 0;
                continue;
            }
            match probe(self, d, i, exhausted) {
                Probe::Yes => {
                    self.inner.consume_noshift(i);
                    return Ok(true);
                }
                Probe::No => i += 1,
                // the buffer already holds that much: a probe that asks again is answered no
                Probe::More(need) if i + need <= have => i += 1,
                Probe::More(need) => {
                    self.inner.consume_noshift(i);
                    i = 0;
                    self.fill(need)?;
                }
            }
        }
    }

    /// The error for a gzip stream cut short where its content is between two records.
    fn gzip_cut_between_records(&self) -> TraceError {
        if !self.inner.data().is_empty() {
            return self.truncated();
        }
        TraceError::GzipCut {
            path: self.path.clone(),
            offset: self.position(),
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
                content: self.gzip,
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
                let what = self.record_length_problem(field(8, big_endian)?)?;
                (what, d.len().saturating_sub(self.legacy_record_header))
            }
            Format::PcapNg => {
                // a section header is in its own byte order, given by its byte-order magic
                let big_endian = if d.get(..4) == Some(&PCAPNG_SHB[..]) {
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

/// The pcapng block types a resynchronization reads on from: section header, interface
/// description, obsolete packet, simple packet, name resolution, interface statistics,
/// enhanced packet, decryption secrets, and custom blocks.
const KNOWN_BLOCKS: [u32; 11] = [0x0a0d_0d0a, 1, 2, 3, 4, 5, 6, 0x0a, 0x0bad, 0x4000_0bad, 9];

fn block_name(block_type: u32) -> std::borrow::Cow<'static, str> {
    match block_type {
        0x0a0d_0d0a => "section header block",
        1 => "interface description block",
        2 => "packet block",
        3 => "simple packet block",
        4 => "name resolution block",
        5 => "interface statistics block",
        6 => "enhanced packet block",
        9 => "systemd journal block",
        0x0a => "decryption secrets block",
        0x0bad | 0x4000_0bad => "custom block",
        other => return format!("block of type {other:#x}").into(),
    }
    .into()
}

/// What is wrong with a whole pcapng block's fixed fields, if anything: too short for them, or
/// a packet's captured length running past the block.
fn block_body_problem(block_type: u32, block: &[u8], big_endian: bool) -> Option<String> {
    let len = block.len();
    let min = match block_type {
        0x0a0d_0d0a => 28,
        1 => 20,
        2 | 6 => 32,
        3 => 16,
        5 => 24,
        0x0a | 0x0bad | 0x4000_0bad => 16,
        _ => 12,
    };
    let name = || block_name(block_type);
    if len < min {
        return Some(format!(
            "{} of {len} bytes is shorter than its fixed fields ({min} bytes)",
            name()
        ));
    }
    if matches!(block_type, 2 | 6) {
        let caplen = u32_in(block[20..24].try_into().expect("4 bytes"), big_endian) as usize;
        if caplen > len - 32 {
            return Some(format!(
                "{}'s captured length ({caplen}) runs past the end of the block ({len} bytes)",
                name()
            ));
        }
    }
    None
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

/// The magic numbers a classic pcap file starts with (µs, ns, the "modified" format), as
/// written in either byte order.
const PCAP_MAGICS: [[u8; 4]; 6] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
    [0x34, 0xcd, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xcd, 0x34],
];

/// What is wrong with a pcapng section header's version, if anything: 1.x is the only one
/// defined (Wireshark's rule), for the first section and every later one.
fn section_version_problem(major: u16, minor: u16) -> Option<String> {
    (major != 1).then(|| format!("version {major}.{minor} (1.x is the only one defined)"))
}

/// What is wrong with the version in a file header pcap-parser accepted, if anything: a classic
/// pcap file is version 2.x (libpcap and Wireshark read no other; 543.0, DG/UX's tcpdump, is
/// accepted as libpcap does), a pcapng section header 1.x (Wireshark's rule).
fn unsupported_version(head: &[u8]) -> Option<String> {
    let u16_at = |at: usize, big_endian: bool| -> Option<u16> {
        let b: [u8; 2] = head.get(at..at + 2)?.try_into().ok()?;
        Some(if big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    };
    if head.starts_with(&PCAPNG_SHB) {
        let big_endian = head.get(8..12)? == [0x1a, 0x2b, 0x3c, 0x4d];
        let (major, minor) = (u16_at(12, big_endian)?, u16_at(14, big_endian)?);
        return section_version_problem(major, minor)
            .map(|v| format!("pcapng section header of {v}"));
    }
    let magic: [u8; 4] = head.get(..4)?.try_into().ok()?;
    let i = PCAP_MAGICS.iter().position(|m| *m == magic)?;
    // PCAP_MAGICS alternates little-endian (as written by a little-endian host) and big-endian
    let big_endian = i % 2 == 1;
    let (major, minor) = (u16_at(4, big_endian)?, u16_at(6, big_endian)?);
    (major != 2 && (major, minor) != (543, 0)).then(|| {
        format!("pcap file header of version {major}.{minor} (libpcap and Wireshark read 2.x only)")
    })
}

/// The error for an input that ends inside its file header (the whole input is `head`):
/// how much of the header there is; not a trace at all when it does not start like one.
fn header_cut(path: PathBuf, head: &[u8], gzip: bool) -> TraceError {
    let n = head.len();
    let start = &head[..n.min(4)];
    let what = if PCAPNG_SHB.starts_with(start) {
        match shb_length(head).filter(|&len| len >= SHB_MIN) {
            Some(len) => {
                format!("the pcapng section header block is {n} of the {len} bytes it claims")
            }
            None => format!("the pcapng section header block is {n} of at least {SHB_MIN} bytes"),
        }
    } else if PCAP_MAGICS.iter().any(|m| m.starts_with(start)) {
        format!("the pcap file header is {n} of 24 bytes")
    } else if gzip {
        return TraceError::GzipNotATrace {
            path,
            head: describe_bytes(head),
        };
    } else {
        return TraceError::NotATrace {
            path,
            magic: describe_bytes(head),
        };
    };
    TraceError::HeaderCut { path, what }
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

/// Reads until `buf` is full or the input ends; how many bytes it read.
pub(crate) fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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
        version: (u16, u16),
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
    Packet(PacketAt),
}

/// A packet record or block at the read position, `offset` bytes long, its data `data_len`
/// bytes at `data_ptr` in the buffer.
struct PacketAt {
    offset: usize,
    ts: RawTs,
    iface: u32,
    wire_len: u32,
    data_ptr: usize,
    data_len: usize,
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
        PcapBlockOwned::Legacy(b) => Step::Packet(PacketAt {
            offset,
            ts: RawTs::Legacy {
                secs: b.ts_sec,
                frac: b.ts_usec,
            },
            iface: 0,
            wire_len: b.origlen,
            data_ptr: b.data.as_ptr() as usize,
            data_len: b.data.len().min(b.caplen as usize),
        }),
        PcapBlockOwned::NG(block) => {
            *format = Some(Format::PcapNg);
            match block {
                Block::SectionHeader(shb) => Step::Section {
                    offset,
                    big_endian: shb.big_endian(),
                    version: (shb.major_version, shb.minor_version),
                },
                Block::InterfaceDescription(idb) => Step::Interface {
                    offset,
                    link: LinkType::from_u32(idb.linktype.0 as u32),
                    // an invalid if_tsresol falls back to the default (microseconds)
                    units_per_sec: if_tsresol(&idb.options).unwrap_or(1_000_000),
                    // if_tsoffset (option code 14), an i64 in section byte order; pcap-parser's
                    // `ts_offset()` reads it little-endian whatever the section. (if_tsresol is
                    // one byte, so its byte order does not matter.)
                    offset_secs: option_u64(&idb.options, 14, section_be)
                        .map(|v| v as i64)
                        .unwrap_or(0),
                },
                Block::EnhancedPacket(epb) => Step::Packet(PacketAt {
                    offset,
                    ts: RawTs::Ng(((epb.ts_high as u64) << 32) | epb.ts_low as u64),
                    iface: epb.if_id,
                    wire_len: epb.origlen,
                    data_ptr: epb.data.as_ptr() as usize,
                    data_len: epb.data.len().min(epb.caplen as usize),
                }),
                Block::SimplePacket(spb) => Step::Packet(PacketAt {
                    offset,
                    ts: RawTs::None,
                    iface: 0,
                    wire_len: spb.origlen,
                    data_ptr: spb.data.as_ptr() as usize,
                    data_len: spb.data.len().min(spb.origlen as usize),
                }),
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
                    Step::Packet(PacketAt {
                        offset,
                        ts: RawTs::Ng(((r32(4) as u64) << 32) | r32(8) as u64),
                        iface: r16(0) as u32,
                        wire_len: r32(16),
                        data_ptr: data.as_ptr() as usize,
                        data_len: data.len().min(caplen),
                    })
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

/// Units per second of an interface's timestamps from its `if_tsresol` option (code 9, one
/// byte): 10^-N seconds, or 2^-N with the high bit set. pcap-parser's `ts_resolution()` refuses
/// every power of two (it tests the exponent before masking the flag bit off), which read a
/// 2^-10 capture's times as microseconds, 1.024 times too fast and thousands of years early.
/// None without the option or where its unit cannot be counted in a u64 (10^-20 and finer,
/// 2^-64 and finer).
fn if_tsresol(options: &[PcapNGOption<'_>]) -> Option<u64> {
    let v = *options.iter().find(|o| o.code.0 == 9)?.value.first()?;
    if v & 0x80 != 0 {
        1u64.checked_shl(u32::from(v & 0x7f))
    } else {
        10u64.checked_pow(u32::from(v))
    }
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

    /// A file header of a version no reader reads (a damaged header, most likely) is an error
    /// naming the version; 2.x pcap and 1.x pcapng in either byte order are read.
    #[test]
    fn unsupported_versions_are_refused() {
        let frame: &[u8] = &[0u8; 60];
        for big_endian in [false, true] {
            for nanos in [false, true] {
                let good = pcap_bytes(big_endian, nanos, &[(1, 0, frame)]);
                let mut r = TraceReader::from_bytes("ok.pcap", good.clone()).unwrap();
                assert!(r.next_frame().unwrap().is_some());
                for (major, minor, ok) in [
                    (2u16, 3u16, true),
                    (2, 9, true),
                    (543, 0, true),
                    (99, 4, false),
                    (1, 0, false),
                    (0, 0, false),
                ] {
                    let mut b = good.clone();
                    let (ma, mi) = if big_endian {
                        (major.to_be_bytes(), minor.to_be_bytes())
                    } else {
                        (major.to_le_bytes(), minor.to_le_bytes())
                    };
                    b[4..6].copy_from_slice(&ma);
                    b[6..8].copy_from_slice(&mi);
                    let got = TraceReader::from_bytes("v.pcap", b);
                    if ok {
                        assert!(got.is_ok(), "{major}.{minor}");
                        continue;
                    }
                    let e = got.err().unwrap();
                    assert_eq!(e.reason(), "unsupported_version");
                    let msg = e.to_string();
                    assert!(
                        msg.starts_with("v.pcap: ")
                            && msg.contains(&format!("version {major}.{minor}")),
                        "{msg}"
                    );
                }
            }
            let mut w = NgWriter::new(big_endian);
            w.interface(&[]);
            w.enhanced_packet(0, 1, frame);
            let good = w.out.clone();
            assert!(TraceReader::from_bytes("ok.pcapng", good.clone()).is_ok());
            let mut b = good;
            let v = if big_endian {
                2u16.to_be_bytes()
            } else {
                2u16.to_le_bytes()
            };
            b[12..14].copy_from_slice(&v);
            let e = TraceReader::from_bytes("v.pcapng", b).err().unwrap();
            assert!(
                e.to_string().contains("section header of version 2.0"),
                "{e}"
            );
            // a later section of another version: the frames before it are read, then the
            // error names the section's place and version
            let mut second = NgWriter::new(big_endian);
            second.interface(&[]);
            second.enhanced_packet(0, 2, frame);
            let mut bad = second.out.clone();
            bad[12..14].copy_from_slice(&v);
            for (tail, ok) in [(second.out.clone(), true), (bad, false)] {
                let mut b = w.out.clone();
                let at = b.len();
                b.extend_from_slice(&tail);
                let mut r = TraceReader::from_bytes("two.pcapng", b).unwrap();
                assert!(r.next_frame().unwrap().is_some());
                let got = r.next_frame();
                if ok {
                    assert!(got.unwrap().is_some());
                    assert!(r.next_frame().unwrap().is_none());
                    continue;
                }
                let e = got.err().unwrap();
                assert_eq!(e.reason(), "unsupported_version");
                assert!(
                    e.to_string()
                        .contains(&format!("section header at byte {at} of version 2.0")),
                    "{e}"
                );
            }
        }
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
                assert!(matches!(e, TraceError::HeaderCut { .. }), "{keep}: {e}");
                assert_eq!(e.reason(), "file_truncated");
                assert!(
                    e.to_string().starts_with(&format!(
                        "s.pcapng: file is cut short: the pcapng section header block is {keep} of "
                    )),
                    "{e}"
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

    /// `if_tsresol` in powers of two (the high bit set: 2^-N seconds) as the pcapng spec
    /// defines it; pcap-parser refuses every such value, which read them as microseconds.
    /// Powers of ten likewise; a unit too fine for a u64 (2^-64, 10^-20) falls back to
    /// microseconds. (A 64-bit timestamp in units finer than about 10^-10 s cannot reach 2023.)
    #[test]
    fn pcapng_ts_resolution_in_powers_of_two_and_ten() {
        // (if_tsresol, units per second)
        for (resol, units) in [
            (0x8a_u8, 1u64 << 10),
            (0x80, 1),
            (0x94, 1 << 20),
            (0x9e, 1 << 30),
            (0xa0, 1 << 32),
            (0, 1),
            (3, 1_000),
            (10, 10_000_000_000),
            (0xc0, 1_000_000), // 2^-64: not countable, the default
            (20, 1_000_000),   // 10^-20: likewise
        ] {
            let mut w = NgWriter::new(false);
            w.interface(&[(9, vec![resol])]);
            // 1,700,000,000.75 s in the interface's units (a quarter short of a second)
            let ts = 1_700_000_000u128 * u128::from(units) + u128::from(units) * 3 / 4;
            w.enhanced_packet(0, ts as u64, b"abc");
            let mut r = TraceReader::from_bytes(format!("r{resol:x}.pcapng"), w.out).unwrap();
            let f = r.next_frame().unwrap().expect("frame skipped");
            let want = if units >= 4 {
                1_700_000_000_750_000_000
            } else {
                1_700_000_000_000_000_000 // whole seconds or halves: the fraction is cut
                    + (units as i64 * 3 / 4) * 1_000_000_000 / units as i64
            };
            assert_eq!(f.ts, Timestamp::from_nanos(want), "if_tsresol {resol:#x}");
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

    /// Every frame's data up to the end of the input, and the error that ended it (if any);
    /// the reader says nothing more after it.
    fn read_all(r: &mut TraceReader) -> (Vec<Vec<u8>>, Option<TraceError>) {
        let mut frames = Vec::new();
        let mut err = None;
        for _ in 0..100_000 {
            match r.next_frame() {
                Ok(Some(f)) => frames.push(f.data.to_vec()),
                Ok(None) => break,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        assert!(r.next_frame().unwrap().is_none(), "read on after the end");
        (frames, err)
    }

    /// A packet whose bytes say which one it is (and cannot be read as a record header).
    fn payload(i: usize) -> Vec<u8> {
        let mut d = vec![0xee; 40 + i % 37];
        d[..4].copy_from_slice(&(i as u32).to_be_bytes());
        d
    }

    /// `n` classic pcap records a tenth of a second apart, and where each record starts.
    fn numbered_pcap(big_endian: bool, nanos: bool, n: usize) -> (Vec<u8>, Vec<usize>) {
        let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
        let recs: Vec<(u32, u32, &[u8])> = payloads
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    1_600_000_000 + i as u32 / 10,
                    (i as u32 % 10) * 1000,
                    &d[..],
                )
            })
            .collect();
        let bytes = pcap_bytes(big_endian, nanos, &recs);
        let mut at = Vec::new();
        let mut o = 24;
        for d in &payloads {
            at.push(o);
            o += 16 + d.len();
        }
        (bytes, at)
    }

    /// `n` enhanced packet blocks after a section header and an interface, and where each
    /// block starts.
    fn numbered_pcapng(big_endian: bool, n: usize) -> (NgWriter, Vec<usize>) {
        let mut w = NgWriter::new(big_endian);
        w.interface(&[]);
        let mut at = Vec::new();
        for i in 0..n {
            at.push(w.out.len());
            w.enhanced_packet(0, 1_600_000_000_000_000 + i as u64 * 1000, &payload(i));
        }
        (w, at)
    }

    fn put32(bytes: &mut [u8], at: usize, x: u32, big_endian: bool) {
        let b = if big_endian {
            x.to_be_bytes()
        } else {
            x.to_le_bytes()
        };
        bytes[at..at + 4].copy_from_slice(&b);
    }

    fn all_but(n: usize, lost: &[usize]) -> Vec<Vec<u8>> {
        (0..n).filter(|i| !lost.contains(i)).map(payload).collect()
    }

    /// Audit repro 1: a record whose incl_len is 0xFFFFFFF0 (record 101 of 655) ended the
    /// reading there; now that record alone is skipped, counted and reported.
    #[test]
    fn pcap_record_with_an_impossible_length_is_skipped() {
        for (be, nanos) in [(false, false), (true, false), (false, true)] {
            let (mut bytes, at) = numbered_pcap(be, nanos, 655);
            put32(&mut bytes, at[100] + 8, 0xffff_fff0, be);
            let mut r = TraceReader::from_bytes("huge_len.pcap", bytes).unwrap();
            let (frames, e) = read_all(&mut r);
            assert_eq!(frames, all_but(655, &[100]));
            let e = e.expect("the skip is reported");
            assert_eq!(e.reason(), "corrupt_record");
            let len = 16 + payload(100).len();
            assert_eq!(
                e.to_string(),
                format!(
                    "huge_len.pcap: corrupt record at byte {}: record claims 4294967280 bytes \
                     of packet data, more than libpcap accepts (262144; the snaplen is 65535); \
                     skipped {len} bytes, reading resumed at byte {}",
                    at[100], at[101]
                )
            );
            assert_eq!(r.stats.corrupt_records, 1);
            assert_eq!(r.stats.corrupt_bytes, len as u64);
            assert_eq!(r.stats.frames, 654);
        }
    }

    /// Unusual but possible headers are read when the record after them is plausible: more
    /// than the snaplen, more captured than sent, an hour and more after the frame before.
    #[test]
    fn pcap_unusual_records_are_read_when_the_next_one_is_plausible() {
        let (mut bytes, at) = numbered_pcap(false, false, 20);
        // snaplen 50 (frames are 40..59 bytes), orig_len below incl_len, a day's gap
        put32(&mut bytes, 16, 50, false);
        put32(&mut bytes, at[2] + 12, 3, false);
        for &rec in &at[5..] {
            let secs = u32::from_le_bytes(bytes[rec..rec + 4].try_into().unwrap());
            put32(&mut bytes, rec, secs + 86_400, false);
        }
        let mut r = TraceReader::from_bytes("u.pcap", bytes).unwrap();
        let (frames, e) = read_all(&mut r);
        assert!(e.is_none(), "{e:?}");
        assert_eq!(frames, all_but(20, &[]));
    }

    /// Audit repro 2: a pcapng block whose trailing length differs from its leading one, or
    /// whose captured length runs past the block, ended the reading (the second as "cut
    /// short"); now the block is skipped by its leading length.
    #[test]
    fn pcapng_block_with_a_corrupt_body_is_skipped_by_its_length() {
        for be in [false, true] {
            for what in ["trailer", "caplen", "short"] {
                let (mut w, at) = numbered_pcapng(be, 9);
                let b = at[2];
                let len = 32 + payload(2).len().next_multiple_of(4);
                match what {
                    "trailer" => put32(&mut w.out, b + len - 4, len as u32 + 4, be),
                    "caplen" => put32(&mut w.out, b + 20, 0x7fff_ffff, be),
                    // a block too short for an enhanced packet block's fields, lengths agreeing
                    _ => {
                        put32(&mut w.out, b + 4, 28, be);
                        put32(&mut w.out, b + 24, 28, be);
                        w.out.drain(b + 28..b + len);
                    }
                }
                let len = if what == "short" { 28 } else { len };
                let mut r = TraceReader::from_bytes("ng.pcapng", w.out).unwrap();
                let (frames, e) = read_all(&mut r);
                assert_eq!(frames, all_but(9, &[2]), "{be} {what}");
                let e = e.expect("reported");
                let msg = e.to_string();
                let want = match what {
                    "trailer" => format!(
                        "enhanced packet block's trailing length ({}) differs from its leading \
                         one ({len})",
                        len + 4
                    ),
                    "caplen" => format!(
                        "enhanced packet block's captured length (2147483647) runs past the end \
                         of the block ({len} bytes)"
                    ),
                    _ => "enhanced packet block of 28 bytes is shorter than its fixed fields \
                          (32 bytes)"
                        .to_string(),
                };
                assert_eq!(
                    msg,
                    format!(
                        "ng.pcapng: corrupt record at byte {b}: {want}; skipped {len} bytes, \
                         reading resumed at byte {}",
                        b + len
                    ),
                    "{be} {what}"
                );
                assert!(!msg.contains("cut short"), "{msg}");
                assert_eq!(r.stats.corrupt_records, 1);
            }
        }
    }

    /// A leading length that cannot be right (not a multiple of 4, below 12, past the end,
    /// beyond any block; or plausible but with neither a matching trailer nor a block where it
    /// ends): the reader scans for the next block whose type is known and whose two lengths
    /// agree, and counts the bytes it skipped.
    #[test]
    fn pcapng_block_with_an_implausible_length_is_resynchronized() {
        for be in [false, true] {
            for bad in [0x0000_0013, 8, 0x00ff_fff0, 0xffff_fff0, 0x0000_0400] {
                let (mut w, at) = numbered_pcapng(be, 9);
                put32(&mut w.out, at[4] + 4, bad, be);
                let mut r = TraceReader::from_bytes("ng.pcapng", w.out).unwrap();
                let (frames, e) = read_all(&mut r);
                assert_eq!(frames, all_but(9, &[4]), "{be} {bad:#x}");
                let msg = e.expect("reported").to_string();
                let skipped = at[5] - at[4];
                assert!(
                    msg.starts_with(&format!(
                        "ng.pcapng: corrupt record at byte {}: enhanced packet block",
                        at[4]
                    )) && msg.ends_with(&format!(
                        "; skipped {skipped} bytes, reading resumed at byte {}",
                        at[5]
                    )),
                    "{msg}"
                );
                assert_eq!(r.stats.corrupt_bytes, skipped as u64);
            }
        }
    }

    /// Corruption in the very first record, two corrupt records in a row, and a corrupt record
    /// right before the end, in both formats.
    #[test]
    fn corrupt_first_consecutive_and_last_records() {
        // classic pcap
        for (case, recs, lost) in [
            ("first", vec![0], vec![0]),
            ("two in a row", vec![7, 8], vec![7, 8]),
            ("last", vec![19], vec![19]),
        ] {
            let (mut bytes, at) = numbered_pcap(false, false, 20);
            for &k in &recs {
                put32(&mut bytes, at[k] + 8, 0x0100_0000, false);
            }
            let mut r = TraceReader::from_bytes("c.pcap", bytes).unwrap();
            let (frames, e) = read_all(&mut r);
            assert_eq!(frames, all_but(20, &lost), "{case}");
            let e = e.expect("reported");
            let msg = e.to_string();
            assert!(
                matches!(e, TraceError::Corrupt { offset, .. } if offset == at[recs[0]] as u64),
                "{case}: {msg}"
            );
            if case == "last" {
                // nothing to read on from: the rest of the file is what was skipped
                let left = payload(19).len();
                assert!(
                    msg.ends_with(&format!(
                        "(the file holds {left} more bytes, with no plausible record in them)"
                    )),
                    "{msg}"
                );
            } else {
                let next = at[recs[recs.len() - 1] + 1];
                assert!(
                    msg.contains(&format!("reading resumed at byte {next}")),
                    "{case}: {msg}"
                );
            }
        }
        // pcapng: trailers that do not match; the first, two in a row, the last
        for (case, blocks) in [("first", vec![0]), ("two", vec![3, 4]), ("last", vec![8])] {
            let (mut w, at) = numbered_pcapng(true, 9);
            for &k in &blocks {
                let len = 32 + payload(k).len().next_multiple_of(4);
                put32(&mut w.out, at[k] + len - 4, 0xdead, true);
            }
            let mut r = TraceReader::from_bytes("c.pcapng", w.out).unwrap();
            let (frames, e) = read_all(&mut r);
            assert_eq!(frames, all_but(9, &blocks), "{case}");
            let msg = e.expect("reported").to_string();
            assert!(msg.contains(&format!("at byte {}", at[blocks[0]])), "{msg}");
            if blocks.len() == 2 {
                assert!(
                    msg.contains(&format!(
                        "1 more corrupt record skipped after it (at byte {})",
                        at[4]
                    )),
                    "{msg}"
                );
                assert_eq!(r.stats.corrupt_records, 2);
            }
        }
        // pcapng: the first block's length garbage, and the two after it too
        let (mut w, at) = numbered_pcapng(false, 9);
        for &b in &at[..3] {
            put32(&mut w.out, b + 4, 0x0bad_f00d, false);
        }
        let mut r = TraceReader::from_bytes("c3.pcapng", w.out).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, all_but(9, &[0, 1, 2]));
        assert!(e.unwrap().to_string().contains(&format!(
            "skipped {} bytes, reading resumed at byte {}",
            at[3] - at[0],
            at[3]
        )));
    }

    /// A run of zeros inside a capture (a hole a crash or a preallocating writer left) was
    /// read as one empty frame stamped 1970 per 16 bytes; it is one corrupt record now. A
    /// lone record of no data between plausible ones is still read.
    #[test]
    fn a_run_of_zeros_is_one_corrupt_record() {
        let (bytes, at) = numbered_pcap(false, true, 20);
        let mut holed = bytes[..at[10]].to_vec();
        holed.extend_from_slice(&[0; 4096]);
        holed.extend_from_slice(&bytes[at[10]..]);
        let mut r = TraceReader::from_bytes("z.pcap", holed).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, all_but(20, &[]));
        assert_eq!(
            e.unwrap().to_string(),
            format!(
                "z.pcap: corrupt record at byte {}: record holds no packet data; skipped 4096 \
                 bytes, reading resumed at byte {}",
                at[10],
                at[10] + 4096
            )
        );
        let (w, at) = numbered_pcapng(true, 9);
        let mut holed = w.out[..at[5]].to_vec();
        holed.extend_from_slice(&[0; 4096]);
        holed.extend_from_slice(&w.out[at[5]..]);
        let mut r = TraceReader::from_bytes("z.pcapng", holed).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, all_but(9, &[]));
        assert!(e.unwrap().to_string().contains("skipped 4096 bytes"));
        // an empty record among others
        let (bytes, at) = numbered_pcap(false, false, 3);
        let mut one = bytes[..at[1]].to_vec();
        one.extend_from_slice(&bytes[at[0]..at[0] + 8]);
        one.extend_from_slice(&[0; 8]);
        one.extend_from_slice(&bytes[at[1]..]);
        let mut r = TraceReader::from_bytes("e.pcap", one).unwrap();
        let (frames, e) = read_all(&mut r);
        assert!(e.is_none(), "{e:?}");
        assert_eq!(frames, [payload(0), Vec::new(), payload(1), payload(2)]);
    }

    /// A corrupt record and then a file cut short: both are told.
    #[test]
    fn a_corrupt_record_then_a_cut() {
        let (mut bytes, at) = numbered_pcap(false, false, 20);
        put32(&mut bytes, at[3] + 8, 0xffff_ffff, false);
        bytes.truncate(at[19] + 20);
        let mut r = TraceReader::from_bytes("cc.pcap", bytes).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, all_but(19, &[3]));
        let msg = e.unwrap().to_string();
        assert!(
            msg.contains(&format!("corrupt record at byte {}", at[3]))
                && msg.ends_with(&format!(
                    "; then file is cut short in the middle of a record at byte {}",
                    at[19]
                )),
            "{msg}"
        );
    }

    /// Random bytes overwritten in the headers of one record, over and over with a fixed
    /// seed: never a panic or a loop, and every frame from the second record after the
    /// damaged one on is read (the damaged one, and the one after it when the damage made the
    /// first swallow part of it, may be lost). Then random flips anywhere past the file's own
    /// headers: each loses a few frames at most.
    #[test]
    fn random_byte_flips_lose_only_the_frames_they_hit() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let n = 120;
        let (pcap, pcap_at) = numbered_pcap(false, false, n);
        let (ng, ng_at) = numbered_pcapng(false, n);
        let ng = ng.out;
        for trial in 0..600 {
            let (good, at, header) = if trial % 2 == 0 {
                (&pcap, &pcap_at, 16)
            } else {
                (&ng, &ng_at, 28)
            };
            let mut bytes = good.clone();
            let k = 10 + next() as usize % (n - 20);
            for _ in 0..1 + next() % 4 {
                let i = at[k] + next() as usize % header;
                bytes[i] = next() as u8;
            }
            let mut r = TraceReader::from_bytes("f", bytes.clone()).unwrap();
            let (frames, _) = read_all(&mut r);
            for (i, p) in (0..n).map(payload).enumerate() {
                if i < k || i >= k + 2 {
                    assert!(
                        frames.contains(&p),
                        "trial {trial}: frame {i} lost (record {k} damaged)"
                    );
                }
            }
            // flips anywhere past the headers
            let mut bytes = good.clone();
            let flips = 1 + next() as usize % 5;
            for _ in 0..flips {
                let i = at[0] + next() as usize % (bytes.len() - at[0]);
                bytes[i] ^= 1 << (next() % 8);
            }
            let mut r = TraceReader::from_bytes("g", bytes).unwrap();
            let (frames, _) = read_all(&mut r);
            let kept = (0..n).filter(|&i| frames.contains(&payload(i))).count();
            assert!(
                kept + 3 * flips >= n,
                "trial {trial}: {kept} of {n} frames kept after {flips} flips"
            );
        }
    }

    /// A gzip stream cut short: without its trailer alone (every record read) it says that the
    /// stream ended where a record ends; cut inside its deflate data, it says where in the
    /// decompressed content the record it cut began (not an offset into the file).
    #[test]
    fn a_gzip_stream_cut_short_says_where_in_its_content() {
        let (plain, _) = numbered_pcap(false, false, 300);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let good = gz.finish().unwrap();
        for cut in [4, 8] {
            let mut r =
                TraceReader::from_bytes("t.pcap.gz", good[..good.len() - cut].to_vec()).unwrap();
            let (frames, e) = read_all(&mut r);
            assert_eq!(frames, all_but(300, &[]), "{cut}");
            let e = e.expect("a cut stream");
            assert!(
                matches!(e, TraceError::GzipCut { offset, .. } if offset == plain.len() as u64),
                "{e:?}"
            );
            assert_eq!(e.reason(), "file_truncated");
            assert!(e.to_string().contains("where a record ends"), "{e}");
        }
        let mut r = TraceReader::from_bytes("t.pcap.gz", good[..good.len() / 2].to_vec()).unwrap();
        let (frames, e) = read_all(&mut r);
        assert!(!frames.is_empty() && frames.len() < 300);
        let e = e.expect("a cut stream").to_string();
        assert!(
            e.contains("in the middle of a record at byte")
                && e.ends_with(" of its decompressed content"),
            "{e}"
        );
    }

    /// Audit repro 3: a gzip stream whose CRC32 (or length) trailer is wrong, and one followed
    /// by bytes that are not another member, were "cut short in the middle of a record" and
    /// counted a frame lost. All their frames are read; a warning says what is wrong.
    #[test]
    fn gzip_trailer_and_trailing_bytes_are_warnings_not_cuts() {
        let (plain, _) = numbered_pcap(false, false, 300);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&plain).unwrap();
        let good = gz.finish().unwrap();
        let want = all_but(300, &[]);
        for (case, bytes) in [
            ("crc", {
                let mut b = good.clone();
                let at = b.len() - 8;
                b[at] ^= 0xff;
                b
            }),
            ("isize", {
                let mut b = good.clone();
                let at = b.len() - 4;
                b[at] ^= 0x01;
                b
            }),
            ("junk", {
                let mut b = good.clone();
                b.extend_from_slice(b"junk after the stream");
                b
            }),
            ("zeros", {
                let mut b = good.clone();
                b.extend_from_slice(&[0; 512]);
                b
            }),
            ("a second member", [&good[..], &good[..]].concat()),
        ] {
            let mut r = TraceReader::from_bytes("t.pcap.gz", bytes).unwrap();
            let (frames, e) = read_all(&mut r);
            if case == "a second member" {
                // its pcap file header is read as a corrupt record, and the rest read on from
                let e = e.unwrap().to_string();
                assert!(
                    e.contains(&format!(
                        "corrupt record at byte {}: record holds no packet data",
                        plain.len()
                    )) && e.ends_with(&format!(
                        "skipped 24 bytes, reading resumed at byte {}",
                        plain.len() + 24
                    )),
                    "{e}"
                );
                assert_eq!(frames, [&want[..], &want[..]].concat());
                assert!(r.warnings().is_empty());
                continue;
            }
            assert!(e.is_none(), "{case}: {e:?}");
            let w = r.warnings().join("\n");
            match case {
                "crc" | "isize" => {
                    assert_eq!(frames, want, "{case}");
                    assert!(
                        w.starts_with("t.pcap.gz: the gzip member from byte 0 to byte ")
                            && w.contains("CRC32 or length trailer that does not match"),
                        "{case}: {w}"
                    );
                }
                "junk" | "zeros" => {
                    assert_eq!(frames, want, "{case}");
                    let n = if case == "junk" { 21 } else { 512 };
                    assert_eq!(
                        w,
                        format!(
                            "t.pcap.gz: the {n} bytes after the end of the gzip stream (from \
                             byte {} of the file) are not another gzip member; they were ignored",
                            good.len()
                        )
                    );
                }
                _ => unreachable!(),
            }
            assert_eq!(r.stats.corrupt_records, 0, "{case}");
        }
        // a stream cut inside its trailer is still cut short
        let mut r = TraceReader::from_bytes("c.pcap.gz", good[..good.len() - 3].to_vec()).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, want);
        assert_eq!(e.unwrap().reason(), "file_truncated");
        // deflate data that does not decompress is an error saying so (a member whose first
        // block has the reserved type, after a good one)
        let mut bad = good.clone();
        bad.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0x07, 0, 0, 0, 0]);
        bad.extend_from_slice(&[0; 8]);
        let mut r = TraceReader::from_bytes("d.pcap.gz", bad).unwrap();
        let (frames, e) = read_all(&mut r);
        assert_eq!(frames, want);
        let msg = e.unwrap().to_string();
        assert!(
            msg.starts_with("d.pcap.gz: corrupt gzip stream (")
                && msg.contains(&format!(
                    "in the gzip member starting at byte {} of the file",
                    good.len()
                )),
            "{msg}"
        );
    }

    /// Audit repro 3: a file shorter than its file header was "cut short in the middle of a
    /// record at byte 0".
    #[test]
    fn a_file_shorter_than_its_header_says_how_much_of_it_there_is() {
        let (pcap, _) = numbered_pcap(true, true, 2);
        for keep in [1, 4, 10, 23] {
            let e = TraceReader::from_bytes("h.pcap", pcap[..keep].to_vec())
                .err()
                .unwrap();
            assert_eq!(
                e.to_string(),
                format!("h.pcap: file is cut short: the pcap file header is {keep} of 24 bytes")
            );
            assert_eq!(e.reason(), "file_truncated");
        }
        let (ng, _) = numbered_pcapng(false, 2);
        let e = TraceReader::from_bytes("h.pcapng", ng.out[..20].to_vec())
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "h.pcapng: file is cut short: the pcapng section header block is 20 of the 28 \
             bytes it claims"
        );
        // what does not start like a capture is not one, however short
        let e = TraceReader::from_bytes("x", b"GE".to_vec()).err().unwrap();
        assert!(matches!(e, TraceError::NotATrace { .. }), "{e}");
    }
}
