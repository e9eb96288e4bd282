//! `pcap:FILE`: re-sampling an existing capture (pcap, pcapng, gzip), with the file's own
//! timestamps. One queue; reading stops at the end of the file. A corrupt record is skipped and
//! the reading goes on; the reader reports the skips (how many, where, where it resumed) once
//! the file has ended, which the capture reports as skipped records (`input_skipped`), not as
//! an input that ended early. A file cut short ends it there (`input_error`, frames before it
//! kept; corrupt records skipped before the cut are in the same message).

use std::path::Path;

use mimic_core::trace::{TraceError, TraceReader};

use super::FrameSink;
use super::{OpenOptions, Opened, Poll, Queue, SourceError};

pub struct FileSource {
    reader: TraceReader,
    done: bool,
    /// The error that ended reading early, if any (reported once by the caller).
    pub error: Option<TraceError>,
}

pub fn open(path: &Path, _opts: &OpenOptions) -> Result<Opened, SourceError> {
    let reader = TraceReader::open(path)?;
    Ok(Opened {
        queues: vec![Box::new(FileSource {
            reader,
            done: false,
            error: None,
        })],
        link: None,
        if_name: String::new(),
        description: format!("file {}", path.display()),
        global_drops: None,
        hw_timestamps: true,
        symmetric: true,
        timestamps: None,
        ports_report: None,
    })
}

impl Queue for FileSource {
    fn poll(&mut self, sink: &mut FrameSink<'_>) -> Result<Poll, SourceError> {
        if self.done {
            return Ok(Poll::End);
        }
        let mut n = 0;
        while n < 256 {
            match self.reader.next_frame() {
                Ok(Some(f)) => {
                    sink(f.ts, f.link, f.wire_len, f.data);
                    n += 1;
                }
                Ok(None) => {
                    self.done = true;
                    for w in self.reader.warnings() {
                        eprintln!("mimic capture: warning: {w}");
                    }
                    break;
                }
                Err(e) => {
                    self.done = true;
                    let resumed = matches!(e, TraceError::Corrupt { .. })
                        && self.reader.stats.corrupt_records > 0
                        && self.reader.ended_early_after_skips().is_none();
                    return Err(if resumed {
                        SourceError::Skipped(e)
                    } else {
                        SourceError::Trace(e)
                    });
                }
            }
        }
        Ok(if n == 0 { Poll::End } else { Poll::Frames(n) })
    }
}
