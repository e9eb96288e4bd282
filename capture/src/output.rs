//! Rotating pcapng output. Each file is written as `NAME.pcapng.part` and renamed to
//! `NAME.pcapng` once complete (section header, interface descriptions, packets, interface
//! statistics), so any `*.pcapng` in the directory is a closed, valid file.
//!
//! Names: `{prefix}-{UTC start of capture, YYYYmmddTHHMMSSZ}-{sequence, 5 digits}.pcapng`.
//! Rotation by size (before a packet would push the file past the limit) and by time
//! (boundaries at multiples of the interval since the epoch, in capture time: a file is closed
//! by the first packet past its boundary, and at the end of capture).
//!
//! Retention ring (`max_files`, tcpdump's `-W`): before a new file is started, the oldest
//! closed files of this capture are deleted until, with the new one, at most `max_files`
//! exist — so the directory never holds more than `max_files` of this capture's files (the one
//! being written included), and never more than `max_files × rotate_bytes` bytes of them. The
//! sequence number keeps counting, so the oldest file left is the one with the lowest number.
//! Files of other captures (another start time or prefix) are never touched.
//!
//! A failed write (a full disk) truncates the file back to its last complete block, appends
//! the statistics block if it fits, renames it, and reports how many buffered packets were lost.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mimic_core::{LinkType, Timestamp};

use crate::pcapng::{self, IfStats};

/// Flush the block buffer to the file when it grows past this.
const FLUSH_AT: usize = 1 << 20;
/// Bytes kept free in a size-limited file for its interface statistics block.
const TRAILER_RESERVE: u64 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: disk full ({source}); capture stopped: every closed file is complete, {lost} buffered packets were lost (counted as dropped)")]
    DiskFull {
        path: PathBuf,
        source: io::Error,
        lost: u64,
    },
}

impl OutputError {
    pub fn is_disk_full(&self) -> bool {
        matches!(self, OutputError::DiskFull { .. })
    }
    /// Packets that were accepted but could not be written.
    pub fn lost(&self) -> u64 {
        match self {
            OutputError::DiskFull { lost, .. } => *lost,
            OutputError::Io { .. } => 0,
        }
    }
}

fn is_space_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
    )
}

#[derive(Clone, Debug)]
pub struct OutputConfig {
    pub dir: PathBuf,
    pub prefix: String,
    pub rotate_bytes: Option<u64>,
    pub rotate_nanos: Option<i64>,
    /// Retention ring: keep at most this many files (the one being written included).
    pub max_files: Option<usize>,
    /// Snaplen written into each interface description.
    pub snaplen: u32,
    pub if_name: String,
    pub if_description: String,
    pub filter: Option<String>,
    /// Section header comments (the capture settings).
    pub comments: Vec<String>,
    pub user_appl: String,
}

/// What the statistics block of a closing file should say.
pub type StatsProvider = Box<dyn Fn() -> (IfStats, String) + Send>;

struct OpenFile {
    file: File,
    part: PathBuf,
    path: PathBuf,
    buf: Vec<u8>,
    /// Bytes known to be on disk: always a block boundary.
    durable: u64,
    /// Packets in `buf` (lost if the flush fails).
    buf_packets: u64,
    packets: u64,
    /// Link types of the interface descriptions written, by interface index.
    ifaces: Vec<LinkType>,
    boundary: Option<i64>,
}

/// What the output did to the directory, readable from other threads while it runs (the
/// capture's summary and its `/metrics` read these same counters).
#[derive(Debug, Default)]
pub struct FileCounters {
    /// Files closed complete (renamed from `….part`), whether still on disk or not.
    pub closed: AtomicU64,
    /// Files closed because the size limit was reached.
    pub rotated_size: AtomicU64,
    /// Files closed because the time boundary was passed.
    pub rotated_time: AtomicU64,
    /// Closed files deleted by the retention ring.
    pub deleted: AtomicU64,
    /// Bytes written to files (blocks on disk, including those of deleted files).
    pub bytes: AtomicU64,
}

impl FileCounters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

pub struct Output {
    cfg: OutputConfig,
    stamp: String,
    seq: u32,
    cur: Option<OpenFile>,
    /// Closed files still on disk, oldest first.
    closed: VecDeque<PathBuf>,
    counters: Arc<FileCounters>,
    stats: StatsProvider,
    last_link: LinkType,
    written: u64,
    failed: bool,
}

/// `YYYYmmddTHHMMSSZ` for a time in ns since the epoch (proleptic Gregorian, UTC).
pub fn utc_stamp(ts: Timestamp) -> String {
    let secs = ts.as_nanos().div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    // civil-from-days (H. Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

impl Output {
    /// Prepares output into `cfg.dir` (created if missing); `start` names the files.
    pub fn new(
        cfg: OutputConfig,
        start: Timestamp,
        stats: StatsProvider,
    ) -> Result<Output, OutputError> {
        fs::create_dir_all(&cfg.dir).map_err(|source| OutputError::Io {
            path: cfg.dir.clone(),
            source,
        })?;
        Ok(Output {
            stamp: utc_stamp(start),
            cfg,
            seq: 0,
            cur: None,
            closed: VecDeque::new(),
            counters: Arc::new(FileCounters::default()),
            stats,
            last_link: LinkType::Ethernet,
            written: 0,
            failed: false,
        })
    }

    /// Closed files still on disk (not deleted by the ring), oldest first.
    pub fn closed_files(&self) -> Vec<PathBuf> {
        self.closed.iter().cloned().collect()
    }
    /// Counts into `c` from now on (set before the first write, so nothing is counted twice).
    pub fn count_into(&mut self, c: Arc<FileCounters>) {
        self.counters = c;
    }
    /// The file counters, shared with whoever reports them.
    pub fn counters(&self) -> Arc<FileCounters> {
        self.counters.clone()
    }
    /// The file being written, if any (its final name; on disk it is `….part` until closed).
    pub fn current_file(&self) -> Option<&Path> {
        self.cur.as_ref().map(|f| f.path.as_path())
    }
    pub fn packets_written(&self) -> u64 {
        self.written
    }

    /// Opens the first file now (so a capture with no packets still leaves a valid file).
    pub fn open_now(&mut self, link: LinkType) -> Result<(), OutputError> {
        self.last_link = link;
        if self.cur.is_none() {
            self.open()?;
            self.ensure_iface(link);
        }
        Ok(())
    }

    /// Deletes the oldest closed files until `keep` remain.
    fn trim_ring(&mut self, keep: usize) -> Result<(), OutputError> {
        while self.closed.len() > keep {
            let old = self.closed.pop_front().expect("non-empty");
            match fs::remove_file(&old) {
                Ok(()) => FileCounters::add(&self.counters.deleted, 1),
                // someone else removed it already: nothing to count
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    self.closed.push_front(old.clone());
                    return Err(OutputError::Io {
                        path: old,
                        source: io::Error::new(
                            source.kind(),
                            format!("deleting the oldest file of the retention ring: {source}"),
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn open(&mut self) -> Result<(), OutputError> {
        if let Some(n) = self.cfg.max_files {
            // room for the new file within the ring
            self.trim_ring(n.saturating_sub(1))?;
        }
        self.seq += 1;
        let name = format!("{}-{}-{:05}.pcapng", self.cfg.prefix, self.stamp, self.seq);
        let path = self.cfg.dir.join(&name);
        let part = self.cfg.dir.join(format!("{name}.part"));
        if path.exists() {
            return Err(OutputError::Io {
                path,
                source: io::Error::new(io::ErrorKind::AlreadyExists, "output file already exists"),
            });
        }
        // locked while the file is written (the kernel releases it when the process dies): a
        // later capture into this directory finishes only `.part` files nobody holds
        let file = create_locked(&self.cfg.dir, &part).map_err(|source| OutputError::Io {
            path: part.clone(),
            source,
        })?;
        let mut buf = Vec::with_capacity(FLUSH_AT + 65_536);
        let os = format!("{} {}", std::env::consts::OS, std::env::consts::ARCH);
        pcapng::section_header(&mut buf, &self.cfg.user_appl, &os, &self.cfg.comments);
        self.cur = Some(OpenFile {
            file,
            part,
            path,
            buf,
            durable: 0,
            buf_packets: 0,
            packets: 0,
            ifaces: Vec::new(),
            boundary: None,
        });
        Ok(())
    }

    fn ensure_iface(&mut self, link: LinkType) -> u32 {
        let cfg = &self.cfg;
        let f = self.cur.as_mut().expect("open file");
        if let Some(i) = f.ifaces.iter().position(|&l| l == link) {
            return i as u32;
        }
        pcapng::interface_description(
            &mut f.buf,
            link.to_u32(),
            cfg.snaplen,
            &cfg.if_name,
            &cfg.if_description,
            cfg.filter.as_deref(),
        );
        f.ifaces.push(link);
        (f.ifaces.len() - 1) as u32
    }

    /// Appends one packet, rotating first when due.
    pub fn write(
        &mut self,
        link: LinkType,
        ts: Timestamp,
        wire_len: u32,
        data: &[u8],
    ) -> Result<(), OutputError> {
        if self.failed {
            return Err(OutputError::Io {
                path: self.cfg.dir.clone(),
                source: io::Error::other("output already failed"),
            });
        }
        self.last_link = link;
        if let Some(f) = &self.cur {
            let size = f.durable + f.buf.len() as u64;
            // room for this packet's block and the closing statistics block
            let need = 32 + data.len() as u64 + 3 + TRAILER_RESERVE;
            let by_size = self
                .cfg
                .rotate_bytes
                .is_some_and(|lim| f.packets > 0 && size + need > lim);
            let by_time = f.boundary.is_some_and(|b| ts.as_nanos() >= b);
            if by_size || by_time {
                self.close_current()?;
                FileCounters::add(
                    if by_size {
                        &self.counters.rotated_size
                    } else {
                        &self.counters.rotated_time
                    },
                    1,
                );
            }
        }
        if self.cur.is_none() {
            self.open()?;
        }
        let iface = self.ensure_iface(link);
        let interval = self.cfg.rotate_nanos;
        let f = self.cur.as_mut().expect("open file");
        if f.boundary.is_none() {
            f.boundary = interval.map(|i| (ts.as_nanos().div_euclid(i) + 1).saturating_mul(i));
        }
        pcapng::enhanced_packet(&mut f.buf, iface, ts, wire_len, data);
        f.packets += 1;
        f.buf_packets += 1;
        if f.buf.len() >= FLUSH_AT {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes buffered blocks to the current file.
    pub fn flush(&mut self) -> Result<(), OutputError> {
        let Some(f) = self.cur.as_mut() else {
            return Ok(());
        };
        if f.buf.is_empty() {
            return Ok(());
        }
        match f.file.write_all(&f.buf) {
            Ok(()) => {
                f.durable += f.buf.len() as u64;
                FileCounters::add(&self.counters.bytes, f.buf.len() as u64);
                self.written += f.buf_packets;
                f.buf.clear();
                f.buf_packets = 0;
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// A write failed: cut the file back to its last complete block, try to end it with the
    /// statistics block, rename it, and turn the error into a report.
    fn fail(&mut self, e: io::Error) -> OutputError {
        self.failed = true;
        let Some(mut f) = self.cur.take() else {
            return OutputError::Io {
                path: self.cfg.dir.clone(),
                source: e,
            };
        };
        let lost = f.buf_packets;
        let _ = f.file.set_len(f.durable);
        if f.ifaces.is_empty() {
            // nothing but the section header made it (or not even that): no valid file
            let _ = fs::remove_file(&f.part);
        } else {
            let (mut stats, comment) = (self.stats)();
            stats.os_dropped += lost;
            let mut tail = Vec::new();
            pcapng::interface_statistics(
                &mut tail,
                0,
                stats.end,
                &stats,
                &format!("{comment}; capture stopped by a write error: {e}"),
            );
            use std::io::{Seek, SeekFrom};
            let ok =
                f.file.seek(SeekFrom::Start(f.durable)).is_ok() && f.file.write_all(&tail).is_ok();
            if !ok {
                let _ = f.file.set_len(f.durable);
            } else {
                FileCounters::add(&self.counters.bytes, tail.len() as u64);
            }
            let _ = f.file.sync_all();
            if f.durable > 0 && fs::rename(&f.part, &f.path).is_ok() {
                self.closed.push_back(f.path.clone());
                FileCounters::add(&self.counters.closed, 1);
            } else {
                let _ = fs::remove_file(&f.part);
            }
        }
        if is_space_error(&e) {
            OutputError::DiskFull {
                path: f.path,
                source: e,
                lost,
            }
        } else {
            OutputError::Io {
                path: f.part,
                source: e,
            }
        }
    }

    fn close_current(&mut self) -> Result<(), OutputError> {
        if self.cur.is_none() {
            return Ok(());
        }
        let link = self.last_link;
        if self.cur.as_ref().is_some_and(|f| f.ifaces.is_empty()) {
            self.ensure_iface(link);
        }
        let (stats, comment) = (self.stats)();
        {
            let f = self.cur.as_mut().expect("open file");
            // the pending packets of this file are delivered once this flush succeeds
            let mut s = stats;
            s.delivered = self.written + f.buf_packets;
            pcapng::interface_statistics(&mut f.buf, 0, s.end, &s, &comment);
        }
        self.flush()?;
        let f = self.cur.take().expect("open file");
        if let Err(e) = f.file.sync_data() {
            self.cur = Some(f);
            return Err(self.fail(e));
        }
        fs::rename(&f.part, &f.path).map_err(|source| OutputError::Io {
            path: f.part.clone(),
            source,
        })?;
        self.closed.push_back(f.path);
        FileCounters::add(&self.counters.closed, 1);
        Ok(())
    }

    /// Closes the current file (if any), leaving every file renamed and complete.
    pub fn close(&mut self) -> Result<(), OutputError> {
        if !self.failed {
            self.close_current()?;
        }
        Ok(())
    }

    /// Closes the current file and returns every closed file.
    pub fn finish(mut self) -> Result<Vec<PathBuf>, OutputError> {
        self.close()?;
        Ok(self.closed.into())
    }
}

/// What became of a `….pcapng.part` that a capture killed before closing it left behind.
#[derive(Debug)]
pub enum LeftPart {
    /// Cut to its last whole block and renamed to its final name: `packets` packets kept,
    /// `cut` trailing bytes of a block cut short removed (its statistics block is missing).
    Recovered {
        path: PathBuf,
        packets: u64,
        cut: u64,
    },
    /// No packet in it: removed.
    Removed { part: PathBuf },
    /// Left as it is, with the reason.
    Kept { part: PathBuf, why: String },
}

impl std::fmt::Display for LeftPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeftPart::Recovered { path, packets, cut } => write!(
                f,
                "{}: recovered from the .part a killed capture left: {packets} packets kept{}, no statistics block",
                path.display(),
                if *cut > 0 { format!(", a block cut short ({cut} bytes) removed") } else { String::new() }
            ),
            LeftPart::Removed { part } => write!(
                f,
                "{}: removed (a killed capture left it without a packet)",
                part.display()
            ),
            LeftPart::Kept { part, why } => {
                write!(f, "{}: left by a killed capture, kept as it is: {why}", part.display())
            }
        }
    }
}

/// Finishes the `….pcapng.part` files of `dir` that no running capture holds (a writer keeps an
/// `flock` on its file), which only a capture that was killed (a SIGKILL, a crash, a power
/// cut) leaves: each becomes a valid pcapng of its whole blocks under its final name, or is
/// removed when it holds no packet; a file that is not pcapng is left as it is.
pub fn finish_left_parts(dir: &Path) -> Vec<LeftPart> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut parts: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".pcapng.part"))
                && p.is_file()
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|p| finish_part(&p)).collect()
}

/// An exclusive `flock` on `f`: waiting for it (`wait`), or failing with `WouldBlock` when
/// another open file description holds it.
fn lock(f: &File, wait: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: a valid open descriptor for the duration of the call.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Creates `part` in `dir` already holding its `flock`, so that no other capture ever sees it
/// unlocked (and takes a file being begun for one a killed capture left): an unnamed file
/// (`O_TMPFILE`) is locked, then linked under its name. Where the file system or a missing
/// `/proc` does not allow that, the file is created and then locked.
fn create_locked(dir: &Path, part: &Path) -> io::Result<File> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    let plain = || create_then_lock(part);
    let unnamed = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o666)
        .open(dir)
    {
        Ok(f) => f,
        // no O_TMPFILE here (EOPNOTSUPP; EISDIR/EINVAL from kernels or file systems without it)
        Err(_) => return plain(),
    };
    lock(&unnamed, true)?;
    let from =
        CString::new(format!("/proc/self/fd/{}", unnamed.as_raw_fd())).expect("no NUL in a number");
    let to = CString::new(part.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the path"))?;
    // SAFETY: two NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        return Ok(unnamed);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Err(e),
        // no /proc to name the file by, or a file system that will not link an unnamed file:
        // the plain way
        _ => plain(),
    }
}

/// [`create_locked`] where an unnamed file cannot be made or linked: the file is created, then
/// locked (a sweep in between could take it for a killed capture's).
fn create_then_lock(part: &Path) -> io::Result<File> {
    let f = OpenOptions::new().write(true).create_new(true).open(part)?;
    lock(&f, true)?;
    Ok(f)
}

fn finish_part(part: &Path) -> LeftPart {
    let kept = |why: String| LeftPart::Kept {
        part: part.to_path_buf(),
        why,
    };
    let path = part.with_extension(""); // NAME.pcapng.part -> NAME.pcapng
    if path.exists() {
        return kept(format!("{} exists", path.display()));
    }
    // held until this function returns; a capture still writing the file holds it
    let held = match OpenOptions::new().write(true).open(part) {
        Ok(f) => f,
        Err(e) => return kept(format!("opening it: {e}")),
    };
    match lock(&held, false) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return kept("a running capture is writing it".into())
        }
        Err(e) => return kept(format!("locking it: {e}")),
    }
    let (end, packets, len, header) = match whole_blocks(part) {
        Ok(x) => x,
        Err(e) => return kept(format!("reading it: {e}")),
    };
    if !header && len > 0 {
        // not a file this writer began (or damaged from its first byte): not ours to remove
        return kept("it does not start with a pcapng section header".into());
    }
    if packets == 0 {
        return match fs::remove_file(part) {
            Ok(()) => LeftPart::Removed {
                part: part.to_path_buf(),
            },
            Err(e) => kept(format!("removing it: {e}")),
        };
    }
    let done = held
        .set_len(end)
        .and_then(|()| held.sync_all())
        .and_then(|()| fs::rename(part, &path));
    match done {
        Ok(()) => LeftPart::Recovered {
            path,
            packets,
            cut: len - end,
        },
        Err(e) => kept(format!("finishing it: {e}")),
    }
}

/// The end of the last whole block of a pcapng file that starts with a section header and
/// describes an interface before its packets, the packets up to there, the file's length, and
/// whether it starts with a section header at all.
fn whole_blocks(p: &Path) -> io::Result<(u64, u64, u64, bool)> {
    use pcap_parser::pcapng::{parse_block_le, Block};
    use std::io::Read;
    let mut f = File::open(p)?;
    let len = f.metadata()?.len();
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let (mut base, mut pos) = (0u64, 0usize); // buf[0] is at file offset `base`
    let (mut end, mut packets, mut header, mut iface) = (0u64, 0u64, false, false);
    let mut eof = false;
    loop {
        match parse_block_le(&buf[pos..]) {
            Ok((rest, block)) => {
                let next = buf.len() - rest.len();
                match block {
                    Block::SectionHeader(_) => header = true,
                    _ if !header => break,
                    Block::InterfaceDescription(_) => iface = true,
                    Block::EnhancedPacket(_) | Block::SimplePacket(_) if !iface => break,
                    Block::EnhancedPacket(_) | Block::SimplePacket(_) => packets += 1,
                    _ => {}
                }
                pos = next;
                end = base + pos as u64;
            }
            Err(pcap_parser::nom::Err::Incomplete(_)) if !eof => {
                // keep the unparsed tail, read more behind it
                buf.drain(..pos);
                base += pos as u64;
                pos = 0;
                let have = buf.len();
                buf.resize(have + (1 << 20), 0);
                let n = f.read(&mut buf[have..])?;
                buf.truncate(have + n);
                eof = n == 0;
            }
            // the end of the file, or a block written in part (or damaged): stop before it
            Err(_) => break,
        }
    }
    Ok((end, packets, len, header))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path, rotate_bytes: Option<u64>, rotate_nanos: Option<i64>) -> OutputConfig {
        OutputConfig {
            dir: dir.to_path_buf(),
            prefix: "t".into(),
            rotate_bytes,
            rotate_nanos,
            max_files: None,
            snaplen: 128,
            if_name: "x".into(),
            if_description: "test".into(),
            filter: None,
            comments: vec!["test".into()],
            user_appl: "mimic test".into(),
        }
    }

    /// An output of `c` for a capture that began at `start_ns`, with empty statistics.
    fn output(c: OutputConfig, start_ns: i64) -> Output {
        Output::new(
            c,
            Timestamp::from_nanos(start_ns),
            Box::new(|| (IfStats::default(), String::new())),
        )
        .unwrap()
    }

    fn count_frames(p: &Path) -> usize {
        let mut r = mimic_core::trace::TraceReader::open(p).unwrap();
        let mut n = 0;
        while r.next_frame().unwrap().is_some() {
            n += 1;
        }
        n
    }

    #[test]
    fn stamp() {
        assert_eq!(utc_stamp(Timestamp::from_nanos(0)), "19700101T000000Z");
        assert_eq!(
            utc_stamp(Timestamp::from_nanos(1_709_210_096_000_000_000)),
            "20240229T123456Z"
        );
    }

    #[test]
    fn rotation_by_size_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = output(cfg(dir.path(), Some(2_000), None), 0);
        for i in 0..100 {
            o.write(
                LinkType::Ethernet,
                Timestamp::from_nanos(i),
                100,
                &[0u8; 100],
            )
            .unwrap();
        }
        let files = o.finish().unwrap();
        assert!(files.len() >= 5, "{files:?}");
        let total: usize = files.iter().map(|f| count_frames(f)).sum();
        assert_eq!(total, 100);
        for f in &files {
            assert!(fs::metadata(f).unwrap().len() <= 2_000 + 200, "{f:?}");
            assert!(f.to_str().unwrap().ends_with(".pcapng"));
        }
        assert!(fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".part")));

        let dir = tempfile::tempdir().unwrap();
        let mut o = output(cfg(dir.path(), None, Some(1_000_000_000)), 0);
        for s in [10, 10, 11, 13, 13, 13] {
            o.write(
                LinkType::Ethernet,
                Timestamp::from_nanos(s * 1_000_000_000 + 5),
                60,
                &[1u8; 60],
            )
            .unwrap();
        }
        let files = o.finish().unwrap();
        assert_eq!(
            files.iter().map(|f| count_frames(f)).collect::<Vec<_>>(),
            vec![2, 1, 3]
        );
    }

    #[test]
    fn ring_keeps_the_newest_files_within_count_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let (n, size) = (3usize, 4096u64);
        let mut c = cfg(dir.path(), Some(size), None);
        c.max_files = Some(n);
        let mut o = output(c, 0);
        let counters = o.counters();
        // 5 × N × S bytes of packet blocks (132 bytes each)
        let packets = 5 * n as u64 * size / 132;
        for i in 0..packets {
            o.write(
                LinkType::Ethernet,
                Timestamp::from_nanos(i as i64),
                100,
                &[0u8; 100],
            )
            .unwrap();
            // at no moment more than N files of this capture on disk, the open one included
            assert!(fs::read_dir(dir.path()).unwrap().count() <= n);
        }
        let files = o.finish().unwrap();
        assert_eq!(files.len(), n);
        let on_disk: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(on_disk.len(), n, "{on_disk:?}");
        let closed = FileCounters::get(&counters.closed);
        let deleted = FileCounters::get(&counters.deleted);
        assert!(closed >= 15, "{closed}");
        assert_eq!(closed - deleted, n as u64);
        assert_eq!(FileCounters::get(&counters.rotated_size), closed - 1);
        let mut total = 0;
        for (i, f) in files.iter().enumerate() {
            assert!(fs::metadata(f).unwrap().len() <= size, "{f:?}");
            // the newest N, in sequence order
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            assert!(
                name.ends_with(&format!("-{:05}.pcapng", closed as usize - n + 1 + i)),
                "{name}"
            );
            total += count_frames(f);
        }
        // the packets of the last files, all complete
        assert!(total > 0 && (total as u64) < packets);
        let bytes: u64 = FileCounters::get(&counters.bytes);
        assert!(bytes > 5 * n as u64 * size, "{bytes}");
    }

    #[test]
    fn empty_capture_leaves_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = output(cfg(dir.path(), None, None), 0);
        o.open_now(LinkType::Raw).unwrap();
        let files = o.finish().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(count_frames(&files[0]), 0);
    }

    /// The `.part` a capture writes is locked while it is written: a second capture's sweep,
    /// even before the first flush (an empty file), leaves it alone, made either way (linked
    /// locked, or created then locked where that cannot be). That no sweep sees it unlocked
    /// between its creation and its lock is `create_locked`'s construction: no test can hit
    /// that window.
    #[test]
    fn a_part_being_written_is_locked_from_its_creation() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = output(cfg(dir.path(), None, None), 1_000_000_000);
        o.open_now(LinkType::Raw).unwrap();
        let part = PathBuf::from(format!("{}.part", o.current_file().unwrap().display()));
        assert_eq!(fs::metadata(&part).unwrap().len(), 0, "nothing flushed yet");
        let left = finish_left_parts(dir.path());
        assert!(
            matches!(&left[..], [LeftPart::Kept { part: p, why }] if *p == part && why.contains("running capture")),
            "{left:?}"
        );
        assert!(part.exists());
        // the name is taken: creating it again fails instead of truncating the file
        assert_eq!(
            create_locked(dir.path(), &part).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        o.finish().unwrap();
        assert!(!part.exists() && finish_left_parts(dir.path()).is_empty());
        // the fallback: created, then locked
        let other = dir.path().join("t-19700101T000001Z-00003.pcapng.part");
        let held = create_then_lock(&other).unwrap();
        let left = finish_left_parts(dir.path());
        assert!(
            matches!(&left[..], [LeftPart::Kept { why, .. }] if why.contains("running capture")),
            "{left:?}"
        );
        drop(held);
        assert!(matches!(
            &finish_left_parts(dir.path())[..],
            [LeftPart::Removed { .. }]
        ));
    }

    /// A `.part` left by a killed capture (here: copied while the writer is still open, then
    /// a block cut short appended, as a kill in the middle of a write leaves it) becomes the
    /// valid file of its whole blocks under its final name; one without a packet is removed;
    /// one whose final name exists is left.
    #[test]
    fn a_part_left_by_a_killed_capture_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = output(cfg(dir.path(), None, None), 1_000_000_000);
        for i in 0..50u8 {
            o.write(
                LinkType::Raw,
                Timestamp::from_nanos(1_000_000_000 + i as i64),
                60,
                &[i; 60],
            )
            .unwrap();
        }
        o.flush().unwrap();
        let part = o.cfg.dir.join(format!(
            "{}.part",
            o.current_file()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
        ));
        let left = tempfile::tempdir().unwrap();
        let copy = left.path().join(part.file_name().unwrap());
        fs::copy(&part, &copy).unwrap();
        let whole = fs::metadata(&copy).unwrap().len();
        // an enhanced packet block's type and length, and part of its body
        let mut f = OpenOptions::new().append(true).open(&copy).unwrap();
        f.write_all(&[6, 0, 0, 0, 96, 0, 0, 0, 0, 0, 0, 0, 1, 2])
            .unwrap();
        drop(f);
        // a .part with nothing but the section header
        let empty = left.path().join("t-19700101T000001Z-00009.pcapng.part");
        let mut shb = Vec::new();
        pcapng::section_header(&mut shb, "mimic test", "linux", &[]);
        fs::write(&empty, &shb).unwrap();
        // a .part whose final name exists
        let taken = left.path().join("t-19700101T000001Z-00007.pcapng");
        fs::write(&taken, b"x").unwrap();
        fs::copy(
            &part,
            left.path().join("t-19700101T000001Z-00007.pcapng.part"),
        )
        .unwrap();

        // a .part that is not pcapng: not removed
        let foreign = left.path().join("notes.pcapng.part");
        fs::write(&foreign, b"my own notes").unwrap();

        let done = finish_left_parts(left.path());
        assert_eq!(done.len(), 4, "{done:?}");
        assert!(foreign.exists());
        assert!(done
            .iter()
            .any(|d| matches!(d, LeftPart::Kept { why, .. } if why.contains("section header"))));
        let final_name = copy.with_extension("");
        assert!(
            done.iter().any(|d| matches!(d, LeftPart::Recovered { path, packets: 50, cut: 14 } if *path == final_name)),
            "{done:?}"
        );
        assert!(done
            .iter()
            .any(|d| matches!(d, LeftPart::Removed { part } if *part == empty)));
        assert!(done
            .iter()
            .any(|d| matches!(d, LeftPart::Kept { why, .. } if why.contains("exists"))));
        assert!(!copy.exists() && !empty.exists());
        assert_eq!(fs::metadata(&final_name).unwrap().len(), whole);
        assert_eq!(count_frames(&final_name), 50);
        let recovered = done
            .iter()
            .find(|d| matches!(d, LeftPart::Recovered { .. }))
            .unwrap()
            .to_string();
        assert!(recovered.contains("no statistics block"), "{recovered}");
        // a .part the running writer holds is left alone
        let running = finish_left_parts(dir.path());
        assert!(
            matches!(&running[..], [LeftPart::Kept { why, .. }] if why.contains("running capture")),
            "{running:?}"
        );
        assert!(part.exists());
        // the writer's own file was not touched, and finishes as usual
        drop(o);
    }
}
