//! `iface:NAME`: libpcap live capture on Linux (TPACKET_V3 ring, nanosecond timestamps, both
//! directions). With several workers, one handle per worker joins a `PACKET_FANOUT_HASH`
//! group: the kernel spreads packets by its *symmetric* flow hash, so both directions of a
//! connection reach the same worker. Drops come from the kernel (`PACKET_STATISTICS` through
//! `pcap_stats`).

use std::os::fd::AsRawFd;

use mimic_core::{LinkType, Timestamp};
use pcap::{Active, Capture, Precision};

use super::{Drops, FrameSink, OpenOptions, Opened, Poll, Queue, SourceError};

const PACKET_FANOUT: libc::c_int = 18;
const PACKET_FANOUT_HASH: u32 = 0;

pub struct LiveSource {
    cap: Capture<Active>,
    link: LinkType,
    fd: libc::c_int,
}

fn err(iface: &str, what: impl std::fmt::Display) -> SourceError {
    SourceError::Live {
        iface: iface.to_string(),
        what: what.to_string(),
    }
}

fn open_handle(iface: &str, opts: &OpenOptions) -> Result<Capture<Active>, SourceError> {
    let cap = Capture::from_device(iface)
        .map_err(|e| err(iface, e))?
        .promisc(opts.promisc)
        .snaplen(opts.snaplen as i32)
        .buffer_size(opts.buffer_bytes.min(i32::MAX as usize) as i32)
        .timeout(50)
        .precision(Precision::Nano)
        .open()
        .map_err(|e| {
            let hint = if e.to_string().contains("ermission") {
                " (capturing needs root or CAP_NET_RAW)"
            } else {
                ""
            };
            err(iface, format!("{e}{hint}"))
        })?;
    let mut cap = cap.setnonblock().map_err(|e| err(iface, e))?;
    if let Some(f) = &opts.filter {
        cap.filter(f, true)
            .map_err(|e| err(iface, format!("BPF filter {f:?}: {e}")))?;
    }
    Ok(cap)
}

pub fn open(iface: &str, opts: &OpenOptions) -> Result<Opened, SourceError> {
    let workers = opts.workers.max(1);
    let mut queues: Vec<Box<dyn Queue>> = Vec::new();
    let group = (std::process::id() & 0xffff) as u32;
    let mut handles = Vec::new();
    for _ in 0..workers {
        let cap = open_handle(iface, opts)?;
        if workers > 1 {
            let fd = cap.as_raw_fd();
            let arg: u32 = group | (PACKET_FANOUT_HASH << 16);
            // SAFETY: fd is the open PF_PACKET socket of `cap`; arg is a valid u32 for the
            // PACKET_FANOUT option and its size is passed.
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_PACKET,
                    PACKET_FANOUT,
                    &arg as *const u32 as *const libc::c_void,
                    std::mem::size_of::<u32>() as u32,
                )
            };
            if rc != 0 {
                return Err(err(
                    iface,
                    format!(
                        "joining PACKET_FANOUT group: {}",
                        std::io::Error::last_os_error()
                    ),
                ));
            }
        }
        handles.push(cap);
    }
    let link = LinkType::from_u32(handles[0].get_datalink().0 as u32);
    if workers > 1 {
        // Until every handle had joined the group, each saw every packet; discard what the
        // rings hold from that moment so no packet is written twice.
        for cap in &mut handles {
            while let Ok(n) = cap.dispatch(None, |_| {}) {
                if n == 0 {
                    break;
                }
            }
        }
    }
    for cap in handles {
        let fd = cap.as_raw_fd();
        queues.push(Box::new(LiveSource { cap, link, fd }));
    }
    Ok(Opened {
        queues,
        link: Some(link),
        if_name: iface.to_string(),
        description: format!("libpcap live capture on {iface}"),
        global_drops: None,
        hw_timestamps: false,
        symmetric: true,
        timestamps: None,
        ports_report: None,
    })
}

impl Queue for LiveSource {
    fn poll(&mut self, sink: &mut FrameSink<'_>) -> Result<Poll, SourceError> {
        let link = self.link;
        let mut handle = |p: pcap::Packet<'_>| {
            let ts = Timestamp::from_parts(
                p.header.ts.tv_sec,
                p.header.ts.tv_usec as u64,
                1_000_000_000,
            )
            .unwrap_or(Timestamp::ZERO);
            sink(ts, link, p.header.len, p.data);
        };
        let got = self
            .cap
            .dispatch(Some(4096), &mut handle)
            .map_err(|e| SourceError::Live {
                iface: String::new(),
                what: e.to_string(),
            })?;
        if got > 0 {
            return Ok(Poll::Frames(got));
        }
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is a valid pollfd for the capture socket; nfds is 1.
        unsafe {
            libc::poll(&mut pfd, 1, 100);
        }
        let got = self
            .cap
            .dispatch(Some(4096), &mut handle)
            .map_err(|e| SourceError::Live {
                iface: String::new(),
                what: e.to_string(),
            })?;
        Ok(if got > 0 {
            Poll::Frames(got)
        } else {
            Poll::Idle
        })
    }

    fn drops(&mut self) -> Drops {
        match self.cap.stats() {
            Ok(s) => Drops {
                dropped: s.dropped as u64,
                if_dropped: s.if_dropped as u64,
            },
            Err(_) => Drops::default(),
        }
    }
}
