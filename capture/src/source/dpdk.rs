//! `dpdk:"EAL ARGS"`: DPDK 22.11 (feature `dpdk`). All of DPDK's C stays behind the shim in
//! `csrc/dpdk_shim.c` and the `extern "C"` block below.
//!
//! **Ports.** Every port the EAL has is captured: the devices given to it (`-a PCI` for NICs,
//! `--vdev=…` for virtual ones; `-b PCI` leaves one out), so the EAL arguments pick the ports.
//! A two-port tap (one direction per port) is one source. Each port gets the same number of RX
//! queues (one per worker, lowered to what the smallest port supports) and worker `q` polls
//! queue `q` of every port: with the same symmetric Toeplitz key (0x6d5a…) and default
//! redirection table on every port, or `net_af_packet` with `qpairs=N` (the kernel's symmetric
//! fanout hash), both directions of a connection reach the same worker even when they arrive on
//! different ports.
//!
//! **Merge.** A worker polling several ports merges them in timestamp order (a k-way merge of
//! the per-port streams, each in order by itself): a frame is handed on once every other port
//! has shown a later frame, or polled empty at a later time (live ports: an idle port does not
//! hold the others back), or ended (file ports). A frame held longer than the reorder window
//! ([`HOLD_LIVE`]) or a port holding [`HOLD_MAX`] frames is handed on anyway (`merge_forced`);
//! a frame that then arrives older than one already handed on is kept and written, counted as
//! `merge_late`. Both counters are per port in the summary's `ports`.
//!
//! **Timestamps.** `net_pcap` replays the file's (at microsecond precision, which is all that
//! PMD keeps). A device that offers the RX timestamp offload and whose clock
//! `rte_eth_read_clock` reads is stamped by the NIC, its ticks converted to wall time by a
//! calibration against CLOCK_REALTIME (two readings 20 ms apart at start, then re-anchored and
//! its rate re-measured every 100 ms). Every other device is stamped per packet from the TSC
//! (`rte_rdtsc`; `rte_get_tsc_hz` at first, then the rate measured against CLOCK_REALTIME
//! over each 100 ms between re-anchorings): the packets of a burst are
//! spread evenly over the time since the previous poll of that queue, the last at the poll's
//! own time (never before it arrived), strictly increasing
//! ([`BurstStamper`]). An idle worker busy-polls for [`SPIN_FOR`] after its last packet, then
//! sleeps [`IDLE_SLEEP`] between polls with a 1 µs timer slack, so a burst arriving on an
//! idle link is stamped at most about that late.
//!
//! Drops: `imissed + ierrors + rx_nombuf` of each port, and — because `net_af_packet`
//! reports imissed = 0 even when its ring overflows — for `iface=NAME` vdevs the interface's
//! kernel counters (`/sys/class/net/NAME/statistics/{rx,tx}_packets`) minus what was received
//! on that port. A `net_pcap` port with `rx_pcap=` ends when no packet came for half a second
//! (the PMD cannot tell the end of its file from an idle link).

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    fn mc_port_name(port: u16, name: *mut c_char, len: usize) -> c_int;
    fn mc_port_max_rx_queues(port: u16) -> c_int;
    fn mc_read_clock(port: u16, ticks: *mut u64) -> c_int;
    fn mc_rdtsc() -> u64;
    fn mc_tsc_hz() -> u64;
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
/// Frames a worker holds per port while waiting for the other ports (then it hands them on).
pub const HOLD_MAX: usize = 8192;
/// The reorder window of live ports: a frame waits at most this long for the other ports.
pub const HOLD_LIVE: Duration = Duration::from_millis(10);
/// A worker busy-polls this long after its last packet before it starts sleeping.
pub const SPIN_FOR: Duration = Duration::from_micros(200);
/// Sleep between empty polls of an idle worker (the thread's timer slack is set to 1 µs).
pub const IDLE_SLEEP: Duration = Duration::from_micros(10);
/// How often the TSC / device clock is re-anchored to CLOCK_REALTIME (the TSC's rate is
/// re-measured over each interval).
const REANCHOR_NS: i64 = 100_000_000;
/// A device-stamped port that polled empty at host time T can still deliver frames the NIC
/// stamped a little before T (DMA, calibration error): its merge watermark is T minus this.
const DEVICE_SLACK_NS: i64 = 1_000_000;
/// File-backed ports end after this long without packets.
const FILE_IDLE_END: Duration = Duration::from_millis(500);
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

/// A free-running counter (the CPU's TSC, a NIC's clock) turned into wall-clock nanoseconds:
/// `anchor_ns + (ticks − anchor_ticks) / hz`, anchored to CLOCK_REALTIME.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickClock {
    pub anchor_ticks: u64,
    pub anchor_ns: i64,
    /// Ticks per second.
    pub hz: u64,
}

impl TickClock {
    pub fn to_ns(&self, ticks: u64) -> i64 {
        // wrapping difference read as signed: a tick a little before the anchor is negative
        let d = ticks.wrapping_sub(self.anchor_ticks) as i64 as i128;
        let ns = self.anchor_ns as i128 + d * 1_000_000_000 / self.hz.max(1) as i128;
        ns.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// The counter's rate from two (ticks, wall ns) readings; None when they cannot tell.
    pub fn calibrate(a: (u64, i64), b: (u64, i64)) -> Option<TickClock> {
        let dt = b.1 - a.1;
        let dticks = b.0.checked_sub(a.0)?;
        if dt <= 0 || dticks == 0 {
            return None;
        }
        let hz = (dticks as u128 * 1_000_000_000 / dt as u128) as u64;
        (hz > 0).then_some(TickClock {
            anchor_ticks: b.0,
            anchor_ns: b.1,
            hz,
        })
    }
}

/// Per-packet stamps for the frames of one RX queue polled in bursts. The frames a poll
/// returns arrived, in order, between the previous poll and this one: the interval is cut into
/// as many equal shares as there are frames and each frame is stamped at the end of its share,
/// so the last (or only) frame gets the poll's own time — a single frame is never stamped
/// before it arrived, only late by at most the poll interval, as software stamps are; the
/// earlier frames of a burst may be off either way by up to the interval (right when the ring
/// filled steadily, early when they came in a clump at its end). (Middles of the shares were
/// tried: an unbiased estimate, but a poller descheduled for 20 ms then stamped a lone packet
/// 10 ms before the kernel saw it.) The interval spread over is at most [`MAX_SPREAD_NS`]
/// before the poll: a longer gap means the poller was held up (descheduled, a late timer), and
/// when in it the frames came is not known — spreading them over milliseconds would invent
/// dispersion that the packet-pair estimator reads as a bottleneck, where frames clumped at
/// the end of the gap (a request and its answer, compressed ACKs) look compressed instead,
/// which it already filters. Stamps are strictly increasing within
/// the burst and strictly after every earlier stamp of the queue — also across a backward step
/// of the clock — and never before the previous poll.
#[derive(Clone, Debug)]
pub struct BurstStamper {
    last_poll: i64,
    last_stamp: i64,
}

/// The longest interval before a poll that a burst's frames are spread over: the poll loop's
/// own rhythm (busy polling, then 10 µs sleeps with their wake-up latency) stays well inside it.
pub const MAX_SPREAD_NS: i64 = 50_000;

impl Default for BurstStamper {
    fn default() -> Self {
        BurstStamper {
            last_poll: i64::MIN,
            last_stamp: i64::MIN,
        }
    }
}

impl BurstStamper {
    /// A poll that ended at `now` (ns) returned nothing: anything later arrived after `now`.
    pub fn empty_poll(&mut self, now: i64) {
        self.last_poll = self.last_poll.max(now);
    }

    /// Stamps the `out.len()` frames of a poll that ended at `now` (ns).
    pub fn stamp(&mut self, now: i64, out: &mut [i64]) {
        let n = out.len() as i128;
        let first = self.last_poll == i64::MIN;
        let from = if first {
            now
        } else {
            self.last_poll.max(now.saturating_sub(MAX_SPREAD_NS))
        };
        // a clock that stepped back leaves no interval: the frames go just after the last poll
        let gap = (now.max(from) - from) as i128;
        for (i, o) in out.iter_mut().enumerate() {
            // the end of the i-th of n equal shares of the interval
            let t = (from as i128 + gap * (i as i128 + 1) / n) as i64;
            let t = t.max(self.last_stamp.saturating_add(1));
            let t = if first {
                t
            } else {
                t.max(from.saturating_add(1))
            };
            *o = t;
            self.last_stamp = t;
        }
        self.last_poll = self.last_poll.max(now);
    }

    /// The earliest stamp a frame of a later poll can get.
    pub fn watermark(&self) -> i64 {
        self.last_poll.max(self.last_stamp)
    }
}

/// The TSC anchored to CLOCK_REALTIME; re-anchored every [`REANCHOR_NS`].
struct TscWall {
    clock: TickClock,
}

impl TscWall {
    fn new() -> TscWall {
        // SAFETY: reads the EAL's TSC rate (measured at rte_eal_init).
        let hz = unsafe { mc_tsc_hz() };
        let mut w = TscWall {
            clock: TickClock {
                anchor_ticks: 0,
                anchor_ns: 0,
                hz,
            },
        };
        w.anchor();
        w
    }

    /// Reads (TSC, CLOCK_REALTIME) as one pair and anchors there. When the previous anchor
    /// is far enough back, the TSC's rate is measured over the interval too: the EAL's
    /// estimate at start can be off by 0.1 % in a VM, 1 ms per second of capture.
    fn anchor(&mut self) {
        // SAFETY: rdtsc has no preconditions.
        let t1 = unsafe { mc_rdtsc() };
        let ns = now().as_nanos();
        // SAFETY: as above.
        let t2 = unsafe { mc_rdtsc() };
        let here = (t1 + (t2.wrapping_sub(t1)) / 2, ns);
        let prev = (self.clock.anchor_ticks, self.clock.anchor_ns);
        if prev.0 != 0 && here.1 - prev.1 >= REANCHOR_NS / 2 {
            if let Some(c) = TickClock::calibrate(prev, here) {
                self.clock.hz = c.hz;
            }
        }
        self.clock.anchor_ticks = here.0;
        self.clock.anchor_ns = here.1;
    }

    fn now(&mut self) -> i64 {
        // SAFETY: rdtsc has no preconditions.
        let ns = self.clock.to_ns(unsafe { mc_rdtsc() });
        if ns - self.clock.anchor_ns >= REANCHOR_NS {
            self.anchor();
            // SAFETY: as above.
            return self.clock.to_ns(unsafe { mc_rdtsc() });
        }
        ns
    }
}

/// How a port's frames are stamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stamping {
    /// The PMD replays a file's timestamps, `unit_ns` per unit (net_pcap: µs).
    File { unit_ns: i64 },
    /// The NIC's RX timestamp, converted with a calibrated device clock.
    Device,
    /// The TSC, per packet.
    Tsc,
}

impl Stamping {
    fn describe(self) -> &'static str {
        match self {
            Stamping::File { .. } => "file timestamps (µs)",
            Stamping::Device => "NIC RX timestamps (device clock calibrated to CLOCK_REALTIME)",
            Stamping::Tsc => "per-packet TSC stamps anchored to CLOCK_REALTIME",
        }
    }
}

/// Counters of one port, shared by the workers polling it.
#[derive(Default)]
struct PortCounters {
    received: AtomicU64,
    bursts: AtomicU64,
    max_burst: AtomicU64,
    merge_forced: AtomicU64,
    merge_late: AtomicU64,
    kernel_dropped: AtomicU64,
}

/// A started port; closed when the last queue and report holding it are dropped.
struct Port {
    id: u16,
    name: String,
    driver: String,
    stamping: Stamping,
    /// net_af_packet's interface (its kernel counters give the drops).
    iface: Option<String>,
    /// Interface counters (rx + tx) when the capture started.
    iface_base: u64,
    file_backed: bool,
    counters: PortCounters,
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by mc_port_setup and nothing uses it any more (this
        // runs when the last queue or report holding the Arc is dropped).
        unsafe { mc_port_close(self.id) };
    }
}

impl Port {
    fn stats(&self) -> Option<(u64, u64, u64, u64)> {
        let (mut ip, mut missed, mut errs, mut nombuf) = (0u64, 0u64, 0u64, 0u64);
        // SAFETY: the port is started; out-pointers are valid locals.
        let rc = unsafe { mc_port_stats(self.id, &mut ip, &mut missed, &mut errs, &mut nombuf) };
        (rc == 0).then_some((ip, missed, errs, nombuf))
    }

    /// af_packet: what the interface saw minus what this port received.
    fn update_kernel_drops(&self) -> u64 {
        let Some(name) = &self.iface else { return 0 };
        let seen = iface_packets(name).saturating_sub(self.iface_base);
        let d = seen.saturating_sub(self.counters.received.load(Ordering::Relaxed));
        self.counters.kernel_dropped.store(d, Ordering::Relaxed);
        d
    }

    fn report(&self) -> serde_json::Value {
        let c = &self.counters;
        let (ip, missed, errs, nombuf) = self.stats().unwrap_or_default();
        serde_json::json!({
            "port": self.id,
            "name": self.name,
            "driver": self.driver,
            "interface": self.iface,
            "timestamps": self.stamping.describe(),
            "received": c.received.load(Ordering::Relaxed),
            "nic_ipackets": ip,
            "nic_imissed": missed,
            "nic_ierrors": errs,
            "nic_rx_nombuf": nombuf,
            "kernel_dropped": c.kernel_dropped.load(Ordering::Relaxed),
            "bursts": c.bursts.load(Ordering::Relaxed),
            "max_burst": c.max_burst.load(Ordering::Relaxed),
            "merge_forced": c.merge_forced.load(Ordering::Relaxed),
            "merge_late": c.merge_late.load(Ordering::Relaxed),
        })
    }
}

fn iface_packets(name: &str) -> u64 {
    sysfs_counter(name, "rx_packets").unwrap_or(0) + sysfs_counter(name, "tx_packets").unwrap_or(0)
}

/// A frame waiting in the merge.
struct Held {
    ts: i64,
    wire_len: u32,
    data: Vec<u8>,
    since: Instant,
}

/// One RX queue of one port, as a worker polls it.
struct PortRx {
    port: Arc<Port>,
    queue: u16,
    stamper: BurstStamper,
    device_clock: Option<TickClock>,
    held: VecDeque<Held>,
    /// No frame of this port is older than this any more (ns).
    watermark: i64,
    idle_since: Option<Instant>,
    ended: bool,
}

/// A worker's queue: queue `q` of every port, merged in timestamp order.
struct DpdkQueue {
    ports: Vec<PortRx>,
    bufs: [*mut RteMbuf; BURST],
    stamps: [i64; BURST],
    copy: Vec<u8>,
    want: u32,
    tsc: Option<TscWall>,
    registered: bool,
    report_port_drops: bool,
    last_rx: Instant,
    /// The newest timestamp handed on by the merge.
    last_emitted: i64,
    spare: Vec<Vec<u8>>,
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

/// The value of `key=` in the `--vdev` argument of the device named `dev` (e.g. net_pcap0).
fn vdev_arg(words: &[String], dev: &str, key: &str) -> Option<String> {
    let mut it = words.iter();
    while let Some(w) = it.next() {
        let spec = if let Some(v) = w.strip_prefix("--vdev=") {
            v.to_string()
        } else if w == "--vdev" {
            it.next()?.clone()
        } else {
            continue;
        };
        let mut parts = spec.split(',');
        if parts.next() != Some(dev) {
            continue;
        }
        if let Some(v) = parts.find_map(|kv| kv.strip_prefix(&format!("{key}=")[..])) {
            return Some(v.to_string());
        }
    }
    None
}

fn read_device_clock(port: u16) -> Option<(u64, i64)> {
    let mut ticks = 0u64;
    // SAFETY: the port is started; ticks is a valid local.
    let rc = unsafe { mc_read_clock(port, &mut ticks) };
    (rc == 0).then(|| (ticks, now().as_nanos()))
}

fn calibrate_device_clock(port: u16) -> Option<TickClock> {
    let a = read_device_clock(port)?;
    std::thread::sleep(Duration::from_millis(20));
    let b = read_device_clock(port)?;
    TickClock::calibrate(a, b)
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
    let nports = unsafe { mc_port_count() };
    if nports <= 0 {
        return Err(err(format!("no DPDK port: give a --vdev (net_pcap0,rx_pcap=FILE or net_af_packet0,iface=IF) or bind a NIC (EAL arguments: {args})")));
    }
    let nports = nports as u16;
    // the same number of queues on every port, so a symmetric hash picks the same worker for
    // both directions of a connection whichever port each arrives on
    let mut nq = opts.workers.clamp(1, 64) as u16;
    for p in 0..nports {
        // SAFETY: p < the number of ports.
        let max = unsafe { mc_port_max_rx_queues(p) };
        if max > 0 {
            nq = nq.min(max as u16);
        }
    }
    let nb_mbufs = (16_384u32).max(nports as u32 * nq as u32 * 4096);
    let mut ports = Vec::new();
    let mut all_rss = true;
    for p in 0..nports {
        let (mut rss, mut hw_ts) = (0 as c_int, 0 as c_int);
        let mut q = nq;
        // SAFETY: port p exists; the out-pointers are valid locals; ebuf is writable.
        let rc = unsafe {
            mc_port_setup(
                p,
                &mut q,
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
        if q != nq {
            return Err(err(format!(
                "port {p} accepted {q} RX queues, not {nq}: give every port as many"
            )));
        }
        all_rss &= rss != 0;
        let mut dbuf = vec![0 as c_char; 64];
        // SAFETY: the port exists; dbuf is writable for its length.
        let driver = if unsafe { mc_port_driver(p, dbuf.as_mut_ptr(), dbuf.len()) } == 0 {
            cstr(&dbuf)
        } else {
            String::new()
        };
        let mut nbuf = vec![0 as c_char; 128];
        // SAFETY: as above.
        let name = if unsafe { mc_port_name(p, nbuf.as_mut_ptr(), nbuf.len()) } == 0 {
            cstr(&nbuf)
        } else {
            format!("port{p}")
        };
        let stamping = match driver.as_str() {
            // net_pcap replays the file's time in microseconds
            "net_pcap" if hw_ts != 0 => Stamping::File { unit_ns: 1_000 },
            "net_pcap" => Stamping::Tsc,
            _ if hw_ts == 1 && read_device_clock(p).is_some() => Stamping::Device,
            _ => Stamping::Tsc,
        };
        let iface = (driver == "net_af_packet")
            .then(|| vdev_arg(&words, &name, "iface"))
            .flatten();
        let file_backed = driver == "net_pcap"
            && (vdev_arg(&words, &name, "rx_pcap").is_some()
                || vdev_arg(&words, &name, "rx_iface").is_none()
                    && vdev_arg(&words, &name, "iface").is_none());
        ports.push(Arc::new(Port {
            id: p,
            iface_base: iface.as_deref().map(iface_packets).unwrap_or(0),
            name,
            driver,
            stamping,
            iface,
            file_backed,
            counters: PortCounters::default(),
        }));
    }
    let device_clocks: Vec<Option<TickClock>> = ports
        .iter()
        .map(|p| {
            (p.stamping == Stamping::Device)
                .then(|| calibrate_device_clock(p.id))
                .flatten()
        })
        .collect();
    let queues: Vec<Box<dyn Queue>> = (0..nq)
        .map(|q| {
            Box::new(DpdkQueue {
                ports: ports
                    .iter()
                    .zip(&device_clocks)
                    .map(|(p, dc)| PortRx {
                        port: p.clone(),
                        queue: q,
                        stamper: BurstStamper::default(),
                        device_clock: *dc,
                        held: VecDeque::new(),
                        watermark: i64::MIN,
                        idle_since: None,
                        ended: false,
                    })
                    .collect(),
                bufs: [std::ptr::null_mut(); BURST],
                stamps: [0; BURST],
                copy: vec![0u8; opts.snaplen as usize],
                want: opts.snaplen,
                tsc: None,
                registered: false,
                report_port_drops: q == 0,
                last_rx: Instant::now(),
                last_emitted: i64::MIN,
                spare: Vec::new(),
            }) as Box<dyn Queue>
        })
        .collect();
    let any_iface = ports.iter().any(|p| p.iface.is_some());
    let global_drops: Option<Box<dyn FnMut(u64) -> u64 + Send>> = any_iface.then(|| {
        let ports = ports.clone();
        Box::new(move |_received: u64| ports.iter().map(|p| p.update_kernel_drops()).sum())
            as Box<dyn FnMut(u64) -> u64 + Send>
    });
    let report_ports = ports.clone();
    let ports_report: Box<dyn Fn() -> serde_json::Value + Send> = Box::new(move || {
        serde_json::Value::Array(report_ports.iter().map(|p| p.report()).collect())
    });
    let all_files = ports
        .iter()
        .all(|p| matches!(p.stamping, Stamping::File { .. }));
    let all_af_packet = ports.iter().all(|p| p.iface.is_some());
    let symmetric = nq == 1 || all_rss || all_af_packet;
    let stampings: Vec<&str> = {
        let mut v: Vec<&str> = ports.iter().map(|p| p.stamping.describe()).collect();
        v.dedup();
        v
    };
    let names: Vec<String> = ports
        .iter()
        .map(|p| p.iface.clone().unwrap_or_else(|| p.name.clone()))
        .collect();
    let description = format!(
        "DPDK {} ({}), {nq} RX queue(s) each{}{}, {}",
        if nports == 1 {
            format!("port {}", ports[0].id)
        } else {
            format!("ports 0-{} merged in time order", nports - 1)
        },
        ports
            .iter()
            .map(|p| format!("{} {}", p.name, p.driver))
            .collect::<Vec<_>>()
            .join(", "),
        if all_rss && nq > 1 {
            ", symmetric RSS"
        } else {
            ""
        },
        if nports > 1 {
            format!(", reorder window {} ms", HOLD_LIVE.as_millis())
        } else {
            String::new()
        },
        stampings.join(" / ")
    );
    Ok(Opened {
        queues,
        link: Some(LinkType::Ethernet),
        if_name: if nports == 1 {
            names[0].clone()
        } else {
            names.join("+")
        },
        description,
        global_drops,
        hw_timestamps: all_files,
        symmetric,
        timestamps: Some(stampings.join(" / ")),
        ports_report: Some(ports_report),
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

impl DpdkQueue {
    fn tsc_now(&mut self) -> i64 {
        self.tsc.get_or_insert_with(TscWall::new).now()
    }

    /// Polls port `i` once; its frames go straight to `sink` (one port) or into its merge
    /// buffer. Returns how many frames the port delivered.
    fn rx(&mut self, i: usize, sink: &mut FrameSink<'_>) -> usize {
        let direct = self.ports.len() == 1;
        let (port_id, queue) = (self.ports[i].port.id, self.ports[i].queue);
        // SAFETY: bufs has room for BURST pointers; the queue was set up by mc_port_setup.
        let n =
            unsafe { mc_rx_burst(port_id, queue, self.bufs.as_mut_ptr(), BURST as u16) } as usize;
        let stamping = self.ports[i].port.stamping;
        let file = matches!(stamping, Stamping::File { .. });
        let now_ns = if !file || n > 0 { self.tsc_now() } else { 0 };
        if n == 0 {
            let p = &mut self.ports[i];
            match stamping {
                Stamping::Tsc => {
                    p.stamper.empty_poll(now_ns);
                    p.watermark = p.watermark.max(p.stamper.watermark());
                }
                Stamping::Device => {
                    p.watermark = p.watermark.max(now_ns - DEVICE_SLACK_NS);
                }
                // a file-backed port polled empty is at the end of its file (it is declared
                // ended only after FILE_IDLE_END): the other ports need not wait for it; a
                // frame it still delivered would be counted in merge_late
                Stamping::File { .. } if p.port.file_backed => p.watermark = i64::MAX,
                Stamping::File { .. } => {}
            }
            let since = *p.idle_since.get_or_insert_with(Instant::now);
            if p.port.file_backed && since.elapsed() >= FILE_IDLE_END {
                p.ended = true;
            }
            return 0;
        }
        {
            let p = &mut self.ports[i];
            p.idle_since = None;
            let c = &p.port.counters;
            c.received.fetch_add(n as u64, Ordering::Relaxed);
            c.bursts.fetch_add(1, Ordering::Relaxed);
            c.max_burst.fetch_max(n as u64, Ordering::Relaxed);
            match stamping {
                Stamping::Tsc => p.stamper.stamp(now_ns, &mut self.stamps[..n]),
                Stamping::Device => {
                    if let Some(dc) = p.device_clock.as_mut() {
                        if now_ns - dc.anchor_ns >= REANCHOR_NS {
                            if let Some(here) = read_device_clock(port_id) {
                                // the rate over the last interval, anchored at its end
                                *dc = TickClock::calibrate((dc.anchor_ticks, dc.anchor_ns), here)
                                    .unwrap_or(TickClock {
                                        anchor_ticks: here.0,
                                        anchor_ns: here.1,
                                        hz: dc.hz,
                                    });
                            }
                        }
                    }
                }
                Stamping::File { .. } => {}
            }
        }
        for k in 0..n {
            let m = self.bufs[k];
            let (mut got, mut len) = (0u32, 0u32);
            // SAFETY: m is an mbuf just returned by rx_burst; copy has `want` bytes.
            let ptr =
                unsafe { mc_mbuf_bytes(m, self.want, self.copy.as_mut_ptr(), &mut got, &mut len) };
            if ptr.is_null() {
                continue;
            }
            // SAFETY: ptr points to `got` contiguous bytes valid until the mbuf is freed below.
            let data = unsafe { std::slice::from_raw_parts(ptr, got as usize) };
            let ts = match stamping {
                Stamping::Tsc => self.stamps[k],
                Stamping::File { unit_ns } => {
                    // SAFETY: m is a valid mbuf.
                    let t = unsafe { mc_mbuf_timestamp(m) };
                    if t >= 0 {
                        t.saturating_mul(unit_ns)
                    } else {
                        now_ns
                    }
                }
                Stamping::Device => {
                    // SAFETY: m is a valid mbuf.
                    let t = unsafe { mc_mbuf_timestamp(m) };
                    match (t >= 0, self.ports[i].device_clock) {
                        (true, Some(dc)) => dc.to_ns(t as u64),
                        _ => now_ns,
                    }
                }
            };
            if direct {
                sink(Timestamp::from_nanos(ts), LinkType::Ethernet, len, data);
            } else {
                let mut buf = self.spare.pop().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(data);
                let p = &mut self.ports[i];
                // a port's frames come in its own time order: nothing older than the last
                // one follows (a file that steps back in time lowers it again)
                p.watermark = if file { ts } else { p.watermark.max(ts) };
                p.held.push_back(Held {
                    ts,
                    wire_len: len,
                    data: buf,
                    since: Instant::now(),
                });
            }
        }
        // SAFETY: the n mbufs came from rx_burst and are no longer referenced.
        unsafe { mc_free_bulk(self.bufs.as_mut_ptr(), n as u32) };
        n
    }

    /// Hands on every held frame the merge can release (all of them with `flush`).
    fn emit(&mut self, sink: &mut FrameSink<'_>, flush: bool) -> usize {
        let mut emitted = 0;
        let mut views: Vec<MergePort> = Vec::with_capacity(self.ports.len());
        loop {
            views.clear();
            views.extend(self.ports.iter().map(|p| MergePort {
                head: p.held.front().map(|h| (h.ts, h.since.elapsed())),
                held: p.held.len(),
                ended: p.ended,
                watermark: p.watermark,
                live: !matches!(p.port.stamping, Stamping::File { .. }),
            }));
            let Some((i, forced)) = next_out(&views, flush) else {
                break;
            };
            let p = &mut self.ports[i];
            let h = p.held.pop_front().expect("head");
            if forced {
                p.port.counters.merge_forced.fetch_add(1, Ordering::Relaxed);
            }
            if h.ts < self.last_emitted {
                p.port.counters.merge_late.fetch_add(1, Ordering::Relaxed);
            }
            self.last_emitted = self.last_emitted.max(h.ts);
            sink(
                Timestamp::from_nanos(h.ts),
                LinkType::Ethernet,
                h.wire_len,
                &h.data,
            );
            self.spare.push(h.data);
            emitted += 1;
        }
        emitted
    }

    fn held(&self) -> usize {
        self.ports.iter().map(|p| p.held.len()).sum()
    }
}

/// What the merge knows about one port.
#[derive(Clone, Copy, Debug)]
struct MergePort {
    /// The oldest held frame: its timestamp and how long it has waited.
    head: Option<(i64, Duration)>,
    held: usize,
    ended: bool,
    /// No later frame of the port is older than this.
    watermark: i64,
    /// Live ports let a frame go after [`HOLD_LIVE`]; file ports wait for the others to end.
    live: bool,
}

/// The port whose head frame the merge hands on next, and whether it goes without every other
/// port having confirmed that nothing older can come (`forced`). The oldest head (the lowest
/// port on a tie) goes when each other port holds a frame, has a watermark at or past it, or has
/// ended; else when it waited [`HOLD_LIVE`] (live), its port holds [`HOLD_MAX`], or on `flush`.
fn next_out(ports: &[MergePort], flush: bool) -> Option<(usize, bool)> {
    let mut best: Option<(usize, i64, Duration)> = None;
    for (i, p) in ports.iter().enumerate() {
        if let Some((t, waited)) = p.head {
            if best.is_none_or(|(_, bt, _)| t < bt) {
                best = Some((i, t, waited));
            }
        }
    }
    let (i, t, waited) = best?;
    let confirmed = ports
        .iter()
        .enumerate()
        .all(|(j, q)| j == i || q.ended || q.held > 0 || q.watermark >= t);
    if confirmed {
        return Some((i, false));
    }
    let p = &ports[i];
    (flush || p.held >= HOLD_MAX || (p.live && waited >= HOLD_LIVE)).then_some((i, true))
}

/// Sets this thread's timer slack to 1 µs so short idle sleeps are not stretched to the
/// default 50 µs.
fn tight_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0) };
}

impl Queue for DpdkQueue {
    fn poll(&mut self, sink: &mut FrameSink<'_>) -> Result<Poll, SourceError> {
        if !self.registered {
            // SAFETY: registers this (non-EAL) thread so mempool caches work; harmless if it fails.
            unsafe { mc_thread_register() };
            tight_timer_slack();
            self.registered = true;
            self.last_rx = Instant::now();
        }
        let started = Instant::now();
        let mut total = 0usize;
        loop {
            let mut got = 0usize;
            for i in 0..self.ports.len() {
                let p = &self.ports[i];
                if p.ended || p.held.len() >= HOLD_MAX {
                    continue;
                }
                got += self.rx(i, sink);
            }
            total += if self.ports.len() == 1 {
                got
            } else {
                self.emit(sink, false)
            };
            if got > 0 {
                self.last_rx = Instant::now();
                if total >= 4096 {
                    break;
                }
                continue;
            }
            if total > 0 || self.ports.iter().all(|p| p.ended) {
                break;
            }
            if started.elapsed() >= Duration::from_millis(100) {
                break;
            }
            if self.last_rx.elapsed() >= SPIN_FOR {
                std::thread::sleep(IDLE_SLEEP);
            } else {
                std::hint::spin_loop();
            }
        }
        if self.ports.iter().all(|p| p.ended) {
            total += self.emit(sink, true);
            if total == 0 {
                return Ok(Poll::End);
            }
        }
        if total > 0 || self.held() > 0 {
            return Ok(Poll::Frames(total));
        }
        Ok(Poll::Idle)
    }

    fn flush(&mut self, sink: &mut FrameSink<'_>) {
        self.emit(sink, true);
    }

    fn drops(&mut self) -> Drops {
        if !self.report_port_drops {
            return Drops::default();
        }
        let mut d = Drops::default();
        for p in &self.ports {
            if let Some((_, missed, errs, nombuf)) = p.port.stats() {
                d.dropped += missed + nombuf;
                d.if_dropped += errs;
            }
        }
        d
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

    #[test]
    fn a_poller_held_up_spreads_a_burst_over_the_last_50us_only() {
        let mut st = BurstStamper::default();
        st.empty_poll(1_000_000);
        // the poller was away 4 ms: two frames (a request and its answer, say) go into the
        // last 50 us before the poll, 25 us apart, not 2 ms apart
        let mut a = [0i64; 2];
        st.stamp(5_000_000, &mut a);
        assert_eq!(a, [4_975_000, 5_000_000]);
        // within the cap nothing changes: four frames over the 20 us since the last poll
        let mut b = [0i64; 4];
        st.stamp(5_020_000, &mut b);
        assert_eq!(b, [5_005_000, 5_010_000, 5_015_000, 5_020_000]);
    }

    #[test]
    fn a_burst_is_spread_over_the_poll_interval_strictly_increasing() {
        let mut st = BurstStamper::default();
        // first poll: nothing known before it, so the burst sits at its time, 1 ns apart
        let mut a = [0i64; 4];
        st.stamp(1_000_000, &mut a);
        assert_eq!(a, [1_000_000, 1_000_001, 1_000_002, 1_000_003]);
        // an empty poll at 1.78 ms, then 32 frames in a poll ending at 1.82 ms: 32 shares of
        // 1.25 us each, every frame at the end of its share, the last at the poll's time
        st.empty_poll(1_780_000);
        assert_eq!(st.watermark(), 1_780_000);
        let mut b = [0i64; 32];
        st.stamp(1_820_000, &mut b);
        assert_eq!(b[0], 1_781_250);
        assert_eq!(b[31], 1_820_000);
        assert!(b.windows(2).all(|w| w[1] - w[0] == 1_250), "{b:?}");
        assert!(
            b[0] > 1_780_000,
            "a frame of this poll arrived after the empty one"
        );
        // the clock stepped back (re-anchoring): still strictly after the last stamp
        let mut c = [0i64; 3];
        st.stamp(1_700_000, &mut c);
        assert_eq!(c, [1_820_001, 1_820_002, 1_820_003]);
        // a poll too close to the last one for distinct ns still gives distinct stamps
        let mut d = [0i64; 5];
        st.stamp(1_820_004, &mut d);
        assert!(d.windows(2).all(|w| w[1] > w[0]) && d[0] > c[2], "{d:?}");
    }

    #[test]
    fn stamps_never_repeat_and_never_fall_below_the_watermark() {
        use proptest::prelude::*;
        proptest!(|(polls in proptest::collection::vec((0i64..50_000, 0usize..=32), 1..200))| {
            let mut st = BurstStamper::default();
            let mut now = 1_700_000_000_000_000_000i64;
            let mut last = i64::MIN;
            for (step, n) in polls {
                now += step;
                let wm = st.watermark();
                if n == 0 {
                    st.empty_poll(now);
                    continue;
                }
                let mut out = vec![0i64; n];
                st.stamp(now, &mut out);
                for &t in &out {
                    prop_assert!(t > last, "{t} after {last}");
                    prop_assert!(t > wm || wm == i64::MIN);
                    last = t;
                }
            }
        });
    }

    #[test]
    fn tick_clock_converts_and_calibrates() {
        // a 2.5 GHz counter anchored at 1000 ticks = 1.7e18 ns
        let c = TickClock {
            anchor_ticks: 1_000,
            anchor_ns: 1_700_000_000_000_000_000,
            hz: 2_500_000_000,
        };
        assert_eq!(c.to_ns(1_000), 1_700_000_000_000_000_000);
        assert_eq!(c.to_ns(3_500), 1_700_000_000_000_001_000);
        assert_eq!(c.to_ns(0), 1_700_000_000_000_000_000 - 400);
        // 10 s at 2.5 GHz without overflow
        assert_eq!(c.to_ns(1_000 + 25_000_000_000), 1_700_000_010_000_000_000);
        // a NIC clock at 156.25 MHz read 20 ms apart
        let k =
            TickClock::calibrate((5_000, 100_000_000), (5_000 + 3_125_000, 120_000_000)).unwrap();
        assert_eq!(k.hz, 156_250_000);
        assert_eq!(k.to_ns(5_000 + 3_125_000 + 156_250), 121_000_000);
        assert!(TickClock::calibrate((5, 10), (5, 20)).is_none());
        assert!(TickClock::calibrate((5, 10), (9, 10)).is_none());
    }

    fn port(head: Option<i64>, held: usize, watermark: i64) -> MergePort {
        MergePort {
            head: head.map(|t| (t, Duration::ZERO)),
            held,
            ended: false,
            watermark,
            live: true,
        }
    }

    #[test]
    fn merge_hands_on_the_oldest_frame_once_no_port_can_send_older() {
        // A holds 10, B holds 20: 10 goes (B's next is at least 20)
        assert_eq!(
            next_out(&[port(Some(10), 2, 10), port(Some(20), 1, 20)], false),
            Some((0, false))
        );
        // equal stamps: the lower port first
        assert_eq!(
            next_out(&[port(Some(20), 1, 20), port(Some(20), 1, 20)], false),
            Some((0, false))
        );
        // B is empty and last polled (empty) at 25: A's 30 must wait, A's 20 may go
        assert_eq!(
            next_out(&[port(Some(30), 1, 30), port(None, 0, 25)], false),
            None
        );
        assert_eq!(
            next_out(&[port(Some(20), 1, 30), port(None, 0, 25)], false),
            Some((0, false))
        );
        // an idle live port that keeps polling empty does not hold the other back
        assert_eq!(
            next_out(&[port(Some(30), 1, 30), port(None, 0, 31)], false),
            Some((0, false))
        );
        // a file port that has not ended holds the others back; once ended it does not
        let mut file = port(None, 0, 5);
        file.live = false;
        let mut a = port(Some(30), 1, 30);
        a.live = false;
        assert_eq!(next_out(&[a, file], false), None);
        file.ended = true;
        assert_eq!(next_out(&[a, file], false), Some((0, false)));
        // nothing held: nothing to do
        assert_eq!(next_out(&[port(None, 0, 5), port(None, 0, 9)], false), None);
    }

    #[test]
    fn merge_lets_a_frame_go_after_the_reorder_window_or_when_the_buffer_is_full() {
        let mut waited = port(Some(30), 1, 30);
        waited.head = Some((30, HOLD_LIVE));
        assert_eq!(
            next_out(&[waited, port(None, 0, 25)], false),
            Some((0, true))
        );
        // a file port never goes by time, only by a full buffer or a flush
        waited.live = false;
        assert_eq!(next_out(&[waited, port(None, 0, 25)], false), None);
        assert_eq!(
            next_out(&[waited, port(None, 0, 25)], true),
            Some((0, true))
        );
        let full = port(Some(30), HOLD_MAX, 30);
        assert_eq!(next_out(&[full, port(None, 0, 25)], false), Some((0, true)));
    }

    #[test]
    fn vdev_arguments_are_found_per_device() {
        let w = split_args(
            "--no-huge --vdev=net_pcap0,rx_pcap=/a.pcap --vdev net_af_packet1,iface=veth1,qpairs=2",
        );
        assert_eq!(
            vdev_arg(&w, "net_pcap0", "rx_pcap").as_deref(),
            Some("/a.pcap")
        );
        assert_eq!(
            vdev_arg(&w, "net_af_packet1", "iface").as_deref(),
            Some("veth1")
        );
        assert_eq!(vdev_arg(&w, "net_af_packet1", "rx_pcap"), None);
        assert_eq!(vdev_arg(&w, "net_pcap1", "rx_pcap"), None);
    }
}
