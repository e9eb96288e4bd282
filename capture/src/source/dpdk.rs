//! `dpdk:"EAL ARGS"`: DPDK 22.11 (feature `dpdk`). All of DPDK's C stays behind the shim in
//! `csrc/dpdk_shim.c` and the `extern "C"` block below.
//!
//! The first DPDK port is captured with one RX queue per worker (lowered to what the device
//! supports). On a NIC with RSS a symmetric Toeplitz key (0x6d5a…) keeps both directions of a
//! connection on one queue; `net_af_packet` with `qpairs=N` spreads by the kernel's symmetric
//! fanout hash. Timestamps: `net_pcap` replays the file's (at microsecond precision, which
//! is all that PMD keeps); every other device is stamped with the host clock, read once per
//! burst of 32 (a NIC's raw timestamp counter is not wall-clock time).
//!
//! Drops: `imissed + ierrors + rx_nombuf` from the port, and — because `net_af_packet`
//! reports imissed = 0 even when its ring overflows — for `iface=NAME` vdevs the interface's
//! kernel counters (`/sys/class/net/NAME/statistics/{rx,tx}_packets`) minus what was received.
//! A `net_pcap` source with `rx_pcap=` ends when no packet came for half a second (the PMD
//! cannot tell the end of its file from an idle link).

use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mimic_core::{LinkType, Timestamp};

use super::{now, Drops, FrameSink, OpenOptions, Opened, Poll, Queue, SourceError};

#[repr(C)]
struct RteMbuf {
    _opaque: [u8; 0],
}

extern "C" {
    fn mc_eal_init(argc: c_int, argv: *mut *mut c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn mc_port_count() -> c_int;
    fn mc_port_driver(port: u16, name: *mut c_char, len: usize) -> c_int;
    fn mc_port_setup(
        port: u16,
        nb_queues: *mut u16,
        nb_desc: u16,
        nb_mbufs: u32,
        rss: *mut c_int,
        hw_ts: *mut c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn mc_rx_burst(port: u16, queue: u16, bufs: *mut *mut RteMbuf, n: u16) -> u16;
    fn mc_mbuf_bytes(
        m: *mut RteMbuf,
        want: u32,
        copy: *mut u8,
        got: *mut u32,
        pkt_len: *mut u32,
    ) -> *const u8;
    fn mc_mbuf_timestamp(m: *const RteMbuf) -> i64;
    fn mc_free_bulk(bufs: *mut *mut RteMbuf, n: u32);
    fn mc_port_stats(
        port: u16,
        ipackets: *mut u64,
        imissed: *mut u64,
        ierrors: *mut u64,
        nombuf: *mut u64,
    ) -> c_int;
    fn mc_thread_register() -> c_int;
    fn mc_thread_unregister();
    fn mc_port_close(port: u16);
}

const BURST: usize = 32;
static EAL_STARTED: AtomicBool = AtomicBool::new(false);

/// Splits EAL arguments on whitespace, honouring single and double quotes.
pub fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Closes the port when the last queue is dropped.
struct Port {
    id: u16,
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by mc_port_setup and no queue uses it any more (this
        // runs when the last queue holding the Arc is dropped).
        unsafe { mc_port_close(self.id) };
    }
}

struct DpdkQueue {
    port: Arc<Port>,
    queue: u16,
    bufs: [*mut RteMbuf; BURST],
    copy: Vec<u8>,
    want: u32,
    hw_ts: bool,
    ts_unit_ns: i64,
    registered: bool,
    report_port_drops: bool,
    /// End of input after this long without packets (file-backed vdevs).
    end_after_idle: Option<Duration>,
    idle_since: Option<Instant>,
}

// SAFETY: the mbuf pointer array is only used by the thread that owns the queue; DPDK RX
// queues may be polled from any single thread at a time.
unsafe impl Send for DpdkQueue {}

fn err(what: impl Into<String>) -> SourceError {
    SourceError::Dpdk(what.into())
}

fn sysfs_counter(iface: &str, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub fn open(args: &str, opts: &OpenOptions) -> Result<Opened, SourceError> {
    if EAL_STARTED.swap(true, Ordering::SeqCst) {
        return Err(err("the DPDK EAL can be started only once per process"));
    }
    let words = split_args(args);
    let mut argv_owned: Vec<CString> = vec![CString::new("mimic-capture").expect("no NUL")];
    for w in &words {
        argv_owned.push(
            CString::new(w.as_str())
                .map_err(|_| err(format!("EAL argument {w:?} contains a NUL byte")))?,
        );
    }
    // EAL may keep pointers into argv: keep the strings for the life of the process
    let argv_owned: &'static [CString] = Box::leak(argv_owned.into_boxed_slice());
    let mut argv: Vec<*mut c_char> = argv_owned
        .iter()
        .map(|c| c.as_ptr() as *mut c_char)
        .collect();
    argv.push(std::ptr::null_mut());
    let argv: &'static mut [*mut c_char] = Box::leak(argv.into_boxed_slice());
    let mut ebuf = vec![0 as c_char; 512];
    // SAFETY: argv holds argc valid NUL-terminated strings followed by NULL, all leaked so
    // they outlive the EAL; ebuf is a writable buffer of the given length.
    let rc = unsafe {
        mc_eal_init(
            (argv.len() - 1) as c_int,
            argv.as_mut_ptr(),
            ebuf.as_mut_ptr(),
            ebuf.len(),
        )
    };
    if rc < 0 {
        return Err(err(format!("{} (EAL arguments: {args})", cstr(&ebuf))));
    }
    // SAFETY: the EAL is initialised.
    let ports = unsafe { mc_port_count() };
    if ports <= 0 {
        return Err(err(format!("no DPDK port: give a --vdev (net_pcap0,rx_pcap=FILE or net_af_packet0,iface=IF) or bind a NIC (EAL arguments: {args})")));
    }
    let port_id = 0u16;
    let mut nq = opts.workers.clamp(1, 64) as u16;
    let (mut rss, mut hw_ts) = (0 as c_int, 0 as c_int);
    let nb_mbufs = (16_384u32).max(nq as u32 * 4096);
    // SAFETY: port 0 exists (count > 0); the out-pointers are valid locals; ebuf is writable.
    let rc = unsafe {
        mc_port_setup(
            port_id,
            &mut nq,
            1024,
            nb_mbufs,
            &mut rss,
            &mut hw_ts,
            ebuf.as_mut_ptr(),
            ebuf.len(),
        )
    };
    if rc != 0 {
        return Err(err(cstr(&ebuf)));
    }
    let port = Arc::new(Port { id: port_id });
    let mut dbuf = vec![0 as c_char; 64];
    // SAFETY: the port exists; dbuf is writable for its length.
    let driver = if unsafe { mc_port_driver(port_id, dbuf.as_mut_ptr(), dbuf.len()) } == 0 {
        cstr(&dbuf)
    } else {
        String::new()
    };
    // What one unit of the RX timestamp is worth in ns. net_pcap replays the file's time in
    // microseconds; a NIC's raw clock ticks are not wall-clock time, so those use the host clock.
    let ts_unit_ns: Option<i64> = match driver.as_str() {
        "net_pcap" if hw_ts != 0 => Some(1_000),
        _ => None,
    };
    let hw_ts = ts_unit_ns.is_some() as c_int;
    let file_backed = words.iter().any(|w| w.contains("rx_pcap="));
    let iface = words.iter().find_map(|w| {
        w.contains("net_af_packet")
            .then(|| {
                w.split(',')
                    .find_map(|kv| kv.strip_prefix("iface=").map(str::to_string))
            })
            .flatten()
    });
    let queues: Vec<Box<dyn Queue>> = (0..nq)
        .map(|q| {
            Box::new(DpdkQueue {
                port: port.clone(),
                queue: q,
                bufs: [std::ptr::null_mut(); BURST],
                copy: vec![0u8; opts.snaplen as usize],
                want: opts.snaplen,
                hw_ts: hw_ts != 0,
                ts_unit_ns: ts_unit_ns.unwrap_or(1),
                registered: false,
                report_port_drops: q == 0,
                end_after_idle: file_backed.then_some(Duration::from_millis(500)),
                idle_since: None,
            }) as Box<dyn Queue>
        })
        .collect();
    let global_drops: Option<Box<dyn FnMut(u64) -> u64 + Send>> = iface.as_ref().map(|name| {
        let name = name.clone();
        let base = sysfs_counter(&name, "rx_packets").unwrap_or(0)
            + sysfs_counter(&name, "tx_packets").unwrap_or(0);
        Box::new(move |received: u64| {
            let seen = sysfs_counter(&name, "rx_packets").unwrap_or(0)
                + sysfs_counter(&name, "tx_packets").unwrap_or(0);
            seen.saturating_sub(base).saturating_sub(received)
        }) as Box<dyn FnMut(u64) -> u64 + Send>
    });
    let symmetric = nq == 1 || rss != 0 || iface.is_some();
    Ok(Opened {
        queues,
        link: Some(LinkType::Ethernet),
        if_name: iface
            .clone()
            .unwrap_or_else(|| format!("dpdk-port{port_id}")),
        description: format!(
            "DPDK port {port_id} ({driver}), {nq} RX queue(s){}{}",
            if rss != 0 { ", symmetric RSS" } else { "" },
            if hw_ts != 0 {
                ", device timestamps"
            } else {
                ", host-clock timestamps"
            }
        ),
        global_drops,
        hw_timestamps: hw_ts != 0,
        symmetric,
    })
}

fn cstr(b: &[c_char]) -> String {
    let bytes: Vec<u8> = b
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Queue for DpdkQueue {
    fn poll(&mut self, sink: &mut FrameSink<'_>) -> Result<Poll, SourceError> {
        if !self.registered {
            // SAFETY: registers this (non-EAL) thread so mempool caches work; harmless if it fails.
            unsafe { mc_thread_register() };
            self.registered = true;
        }
        let started = Instant::now();
        let mut total = 0usize;
        let mut spins = 0u32;
        loop {
            // SAFETY: bufs has room for BURST pointers; the queue was set up by mc_port_setup.
            let n = unsafe {
                mc_rx_burst(
                    self.port.id,
                    self.queue,
                    self.bufs.as_mut_ptr(),
                    BURST as u16,
                )
            } as usize;
            if n == 0 {
                if total > 0 {
                    break;
                }
                spins += 1;
                if spins > 64 {
                    std::thread::sleep(Duration::from_micros(50));
                }
                if started.elapsed() >= Duration::from_millis(100) {
                    break;
                }
                continue;
            }
            let clock = if self.hw_ts { Timestamp::ZERO } else { now() };
            for i in 0..n {
                let m = self.bufs[i];
                let (mut got, mut len) = (0u32, 0u32);
                // SAFETY: m is an mbuf just returned by rx_burst; copy has `want` bytes.
                let p = unsafe {
                    mc_mbuf_bytes(m, self.want, self.copy.as_mut_ptr(), &mut got, &mut len)
                };
                if p.is_null() {
                    continue;
                }
                // SAFETY: p points to `got` contiguous bytes valid until the mbuf is freed below.
                let data = unsafe { std::slice::from_raw_parts(p, got as usize) };
                let ts = if self.hw_ts {
                    // SAFETY: m is a valid mbuf.
                    let t = unsafe { mc_mbuf_timestamp(m) };
                    if t >= 0 {
                        Timestamp::from_nanos(t.saturating_mul(self.ts_unit_ns))
                    } else {
                        now()
                    }
                } else {
                    clock
                };
                sink(ts, LinkType::Ethernet, len, data);
            }
            // SAFETY: the n mbufs came from rx_burst and are no longer referenced.
            unsafe { mc_free_bulk(self.bufs.as_mut_ptr(), n as u32) };
            total += n;
            if total >= 4096 {
                break;
            }
        }
        if total > 0 {
            self.idle_since = None;
            return Ok(Poll::Frames(total));
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if self.end_after_idle.is_some_and(|d| since.elapsed() >= d) {
            return Ok(Poll::End);
        }
        Ok(Poll::Idle)
    }

    fn drops(&mut self) -> Drops {
        if !self.report_port_drops {
            return Drops::default();
        }
        let (mut ip, mut missed, mut errs, mut nombuf) = (0u64, 0u64, 0u64, 0u64);
        // SAFETY: the port is started; out-pointers are valid locals.
        if unsafe { mc_port_stats(self.port.id, &mut ip, &mut missed, &mut errs, &mut nombuf) } != 0
        {
            return Drops::default();
        }
        Drops {
            dropped: missed + nombuf,
            if_dropped: errs,
        }
    }
}

impl Drop for DpdkQueue {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: this thread registered itself in poll().
            unsafe { mc_thread_unregister() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eal_args_split() {
        assert_eq!(
            split_args("--no-huge  -m 256 --vdev='net_pcap0,rx_pcap=/tmp/a b.pcap'"),
            vec![
                "--no-huge",
                "-m",
                "256",
                "--vdev=net_pcap0,rx_pcap=/tmp/a b.pcap"
            ]
        );
        assert_eq!(split_args(""), Vec::<String>::new());
        assert_eq!(split_args("a \"\" b"), vec!["a", "", "b"]);
    }
}
