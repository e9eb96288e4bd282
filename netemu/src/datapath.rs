//! The userspace datapath: bridges two interfaces through the [`Engine`] on one dedicated
//! thread.
//!
//! * Receive: an AF_PACKET socket per interface with a TPACKET_V2 receive ring (mmap, no copy
//!   and no system call per frame); the frame's arrival time is the kernel's receive timestamp
//!   (converted to CLOCK_MONOTONIC), so the time the thread takes to get to a frame does not add
//!   to the emulated delay.
//! * Transmit: `sendmmsg` on the other interface's socket (PACKET_QDISC_BYPASS), in batches.
//!   Our own transmissions are not seen again (PACKET_IGNORE_OUTGOING).
//! * Timing: CLOCK_MONOTONIC, timer slack 1 ns, `ppoll` with a nanosecond timeout until
//!   `spin` before the next departure, then a busy wait (which keeps receiving) until it is due.
//!   Optional SCHED_FIFO priority.
//! * Bounds: a fixed pool of frame buffers; a frame arriving when the pool is empty is dropped
//!   and counted (`no_buffer`). Ring overruns are counted by the kernel (`ring_drops`).

use std::io;
use std::os::fd::RawFd;
use std::sync::mpsc::Receiver;

use mimic_core::cpu::{thread_cpu_ns, Interruptions, LoadSample, MachineLoad, SpinBudget};
use serde::{Deserialize, Serialize};

use crate::engine::{Action, Engine, Side, Verdict};
use crate::units::Nanos;

/// A job the control channel runs on the datapath thread, between packets.
pub type Job = Box<dyn FnOnce(&mut Ctx<'_>) + Send>;

/// What a [`Job`] can touch.
pub struct Ctx<'a> {
    pub engine: &'a mut Engine<u32>,
    pub stats: &'a DatapathStats,
    pub now: Nanos,
    /// Set to stop the datapath after this job.
    pub stop: &'a mut bool,
}

#[derive(Clone, Debug)]
pub struct DatapathConfig {
    pub client_if: String,
    pub server_if: String,
    /// Frames per receive ring (rounded up to a multiple of 32).
    pub ring_frames: u32,
    /// Frame buffers for packets waiting in pipes.
    pub buffers: u32,
    /// Busy-wait this long before a departure instead of sleeping.
    pub spin_ns: Nanos,
    /// SCHED_FIFO priority for the datapath thread (None: normal scheduling).
    pub rt_priority: Option<i32>,
    /// Pin the datapath thread to this CPU (None: wherever the scheduler puts it).
    pub cpu: Option<usize>,
    /// What limits busy-waiting (see [`SpinRule`]).
    pub spin_rule: SpinRule,
}

/// How much of each 10 ms window the datapath may busy-wait before departures: the one
/// place that decides is [`Spinner`], the rule for each use is chosen here.
///
/// * A datapath that has its machine to itself ([`SpinRule::ROUTER`], the default, `mimic
///   netemu run`): always up to half of the window. Under the 50 kpps load of
///   `bench/netemu.sh` at 65,536 pipes it kept the added-delay error at p99 45.3 µs on a
///   quiet host, against 1,604 µs with the load-following rule.
/// * A datapath that shares its machine with the emulated clients and servers
///   ([`SpinRule::BESIDE_HOSTS`], chosen by `mimic replay` for the lab's router): less as the
///   rest of the machine gets busy. At 1,000 concurrent connections on 2 cores, server delays
///   were p99 1.7-9.8 ms late with spinning always allowed (bench/RESULTS.md, Scale; before
///   the CPU split).
///
/// Why one load rule cannot serve both: the load rule reads the machine's busy time from
/// `/proc/stat` (less its own spinning), which counts the datapath's own forwarding (its
/// receive and `sendmmsg` work, with the receiving veth's softirq processing it carries),
/// the traffic generator's sends and the receiver's reads alike; nothing there tells a
/// traffic generator that merely feeds the datapath from the replay's clients and servers
/// that need the CPU it would spin on. At 50 kpps these use more than 0.4 of a core on a
/// 2-core machine, so the load rule allowed no spinning in nearly every window even on a
/// quiet host (`spin cut in` in netemu-bench's notes). Leaving out the datapath's own CPU time
/// does not help: measured under that load (`machine_busy_cores`, `datapath_cores`), the rest
/// still came to 0.54-0.60 cores beside the datapath's 0.53-0.57 (netemu/README.md).
/// What might tell them apart is whether other tasks wait for a CPU rather than how much they
/// use (`/proc/pressure/cpu`), but that is system-wide (tasks waiting behind each other count
/// as much as tasks waiting behind the datapath), missing on kernels built with PSI off by
/// default unless booted with `psi=1`, and untried against the replay's timing; so each use
/// names its rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpinRule {
    /// Always up to half of the window, whatever the load (the rule of the builds before the
    /// load-following one, and the default again since issue 22).
    #[default]
    Fixed,
    /// Up to half of the window, less as the rest of the machine gets busy ([`MachineLoad`];
    /// [`SpinBudget`] has the thresholds).
    FollowLoad,
    /// Busy-polls all the time, never sleeps (the way a DPDK router keeps its cores): for a
    /// datapath on a CPU of its own (`--cpu N`), where its spinning takes nobody's time. It
    /// costs that whole CPU even while idle, and runs at normal priority whatever
    /// `rt_priority` asks: the kernel throttles a real-time thread that never sleeps (for 50
    /// ms of each second at its default `sched_rt_runtime_us`), which would stall every
    /// departure of that time. Under dense traffic the half-window budgets leave the other
    /// half of the departures to timed sleeps, whose wake-ups on a VM run tens of µs late
    /// (netemu/README.md, "Busy-polling a CPU of its own").
    Always,
}

impl SpinRule {
    /// The datapath of a router host that only forwards (`mimic netemu run`'s default).
    pub const ROUTER: SpinRule = SpinRule::Fixed;
    /// The datapath beside the replay's emulated clients and servers on one machine (`mimic
    /// replay --lab` starts its router with it).
    pub const BESIDE_HOSTS: SpinRule = SpinRule::FollowLoad;

    /// The headroom the spin budget of the windows to come follows, given a sample of the
    /// machine's load.
    pub fn headroom(self, sample: &LoadSample) -> f64 {
        match self {
            SpinRule::Fixed | SpinRule::Always => SpinBudget::ROOM_FULL,
            SpinRule::FollowLoad => sample.headroom,
        }
    }
}

impl std::str::FromStr for SpinRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fixed" => Ok(SpinRule::Fixed),
            "load" => Ok(SpinRule::FollowLoad),
            "always" => Ok(SpinRule::Always),
            other => Err(format!(
                "unknown spin rule `{other}` (fixed, load or always)"
            )),
        }
    }
}

impl std::fmt::Display for SpinRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpinRule::Fixed => "fixed",
            SpinRule::FollowLoad => "load",
            SpinRule::Always => "always",
        })
    }
}

impl Default for DatapathConfig {
    fn default() -> Self {
        DatapathConfig {
            client_if: String::new(),
            server_if: String::new(),
            ring_frames: 4096,
            buffers: 65_536,
            spin_ns: 100_000,
            rt_priority: None,
            cpu: None,
            spin_rule: SpinRule::default(),
        }
    }
}

/// Datapath counters. Lateness is how long after its due time a packet was handed to the
/// kernel (the scheduling error the datapath adds).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatapathStats {
    pub rx_frames: [u64; 2],
    pub tx_frames: [u64; 2],
    pub tx_errors: u64,
    pub no_buffer: u64,
    pub ring_drops: u64,
    /// Frames larger than a ring slot (about 1,980 bytes), dropped.
    pub oversize: u64,
    pub forwarded_unshaped: u64,
    pub pipe_drops: u64,
    pub discarded: u64,
    pub late_p50_ns: u64,
    pub late_p99_ns: u64,
    pub late_max_ns: u64,
    /// 10 ms windows in which busy-waiting was cut back because the machine was busy.
    pub spin_reduced_windows: u64,
    /// Sleeps (`ppoll` until the next departure) that ran out, and how long after the
    /// requested instant the thread got back (the wake-up latency the kernel adds; a
    /// departure after such a sleep is at least this late).
    #[serde(default)]
    pub timed_sleeps: u64,
    #[serde(default)]
    pub wake_late_p99_ns: u64,
    #[serde(default)]
    pub wake_late_max_ns: u64,
    /// How long frames waited between the kernel's receive timestamp and the thread taking
    /// them from the ring.
    #[serde(default)]
    pub rx_wait_p99_ns: u64,
    #[serde(default)]
    pub rx_wait_max_ns: u64,
    /// What the machine did while the datapath ran, in cores, from the samples of its load
    /// (one every 200 ms; [`MachineLoad`]): all CPUs' busy time, the datapath's busy-waiting
    /// (part of it), and the datapath thread's own CPU time (spinning included) over its run.
    /// What the load-following rule counts as the rest of the machine's use is
    /// `machine_busy_cores - spin_cores`.
    #[serde(default)]
    pub load_samples: u64,
    #[serde(default)]
    pub machine_busy_cores: f64,
    #[serde(default)]
    pub spin_cores: f64,
    #[serde(default)]
    pub datapath_cores: f64,
    /// Times the scheduler gave the datapath's CPU to another task while the datapath could
    /// run (involuntary context switches over its run), and the page faults it took: each
    /// can make the departures due meanwhile late (netemu/README.md, "What takes the
    /// datapath's CPU").
    #[serde(default)]
    pub preempted: u64,
    #[serde(default)]
    pub page_faults: u64,
    #[serde(skip)]
    pub late_hist: Vec<u64>,
    #[serde(skip)]
    pub wake_hist: Vec<u64>,
    #[serde(skip)]
    pub rx_wait_hist: Vec<u64>,
}

const LATE_BUCKET_NS: u64 = 1_000;
const LATE_BUCKETS: usize = 10_001;

/// Adds `ns` to a histogram of 1 µs buckets (the last one open-ended).
fn record(hist: &mut Vec<u64>, max: &mut u64, ns: u64) {
    if hist.is_empty() {
        *hist = vec![0; LATE_BUCKETS];
    }
    let b = ((ns / LATE_BUCKET_NS) as usize).min(LATE_BUCKETS - 1);
    hist[b] += 1;
    *max = (*max).max(ns);
}

/// The `q` quantile of a histogram of [`record`] (the bucket's upper bound, at most `max`);
/// 0 when empty.
fn quantile(hist: &[u64], max: u64, q: f64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = (total as f64 * q).ceil() as u64;
    let mut acc = 0;
    for (i, c) in hist.iter().enumerate() {
        acc += c;
        if acc >= target {
            return ((i as u64 + 1) * LATE_BUCKET_NS).min(max);
        }
    }
    max
}

impl DatapathStats {
    fn record_late(&mut self, ns: u64) {
        record(&mut self.late_hist, &mut self.late_max_ns, ns);
    }

    fn record_wake(&mut self, ns: u64) {
        self.timed_sleeps += 1;
        record(&mut self.wake_hist, &mut self.wake_late_max_ns, ns);
    }

    /// Fills the percentile fields from the histograms (1 µs buckets; upper bounds).
    pub fn finish(&mut self) {
        let p = self.percentiles();
        self.set_percentiles(p);
    }

    /// The counters and percentiles now, without the histograms: what a `/metrics` scrape or
    /// `netemu counters` reads on the datapath thread between packets. Copying the three
    /// histograms (240 KB) took 60-190 µs there, a stall longer than the datapath's own p99.
    pub fn snapshot(&self) -> DatapathStats {
        let mut s = DatapathStats {
            late_hist: Vec::new(),
            wake_hist: Vec::new(),
            rx_wait_hist: Vec::new(),
            ..*self
        };
        s.set_percentiles(self.percentiles());
        s
    }

    /// (late p50, late p99, wake-up late p99, ring wait p99); the lateness pair is None
    /// while nothing has been sent, so the fields keep what they held.
    fn percentiles(&self) -> (Option<(u64, u64)>, u64, u64) {
        let late = self.late_hist.iter().any(|&c| c > 0).then(|| {
            (
                quantile(&self.late_hist, self.late_max_ns, 0.5),
                quantile(&self.late_hist, self.late_max_ns, 0.99),
            )
        });
        (
            late,
            quantile(&self.wake_hist, self.wake_late_max_ns, 0.99),
            quantile(&self.rx_wait_hist, self.rx_wait_max_ns, 0.99),
        )
    }

    fn set_percentiles(&mut self, (late, wake, rx_wait): (Option<(u64, u64)>, u64, u64)) {
        if let Some((p50, p99)) = late {
            self.late_p50_ns = p50;
            self.late_p99_ns = p99;
        }
        self.wake_late_p99_ns = wake;
        self.rx_wait_p99_ns = rx_wait;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("{what}: {err}")]
    Os { what: String, err: io::Error },
}

fn os(what: impl Into<String>) -> DatapathError {
    DatapathError::Os {
        what: what.into(),
        err: io::Error::last_os_error(),
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn mono_now() -> Nanos {
    clock(libc::CLOCK_MONOTONIC)
}

fn clock(id: libc::clockid_t) -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const FRAME_SIZE: u32 = 2048;
const SPIN_WINDOW_NS: u64 = 10_000_000;

/// What [`Spinner::next_wait`] tells the datapath to do next.
#[derive(Debug, PartialEq, Eq)]
enum Wait {
    /// Another pass at once.
    Pass,
    /// `ppoll` with this timeout (None: no timeout).
    Poll(Option<Nanos>),
}

/// The datapath's busy-wait budget under its [`SpinRule`]: at most half of each 10 ms window
/// (so that a SCHED_FIFO datapath under dense traffic never runs into the kernel's RT
/// throttling, which would stall it for 50 ms a second), and under [`SpinRule::FollowLoad`]
/// less as the rest of the machine gets busy. Spinning makes departures exact (packet
/// spacing, hence the bandwidth the receiver sees) while the machine has CPU to spare. The
/// machine's load is sampled under either rule (one `/proc/stat` read every 200 ms), so that
/// the statistics say what the machine did beside the datapath.
struct Spinner {
    rule: SpinRule,
    budget: SpinBudget,
    load: MachineLoad,
    spinning_since: Option<Nanos>,
    samples: u64,
    busy_sum: f64,
    spun_sum: f64,
}

impl Spinner {
    fn new(rule: SpinRule, load: MachineLoad) -> Spinner {
        Spinner {
            rule,
            budget: SpinBudget::new(SPIN_WINDOW_NS, SPIN_WINDOW_NS / 2),
            load,
            spinning_since: None,
            samples: 0,
            busy_sum: 0.0,
            spun_sum: 0.0,
        }
    }

    /// Before the datapath decides at `now` whether to spin: counts the busy wait that just
    /// ended, takes a load sample when one is due, and starts a new window when this one is
    /// over. True if that new window's budget is cut.
    fn update(&mut self, now: Nanos) -> bool {
        if let Some(since) = self.spinning_since.take() {
            self.budget.add_spin(now.saturating_sub(since));
        }
        if let Some(s) = self.load.sample(now, self.budget.spun_total()) {
            self.observe(&s);
        }
        self.budget.roll(now)
    }

    /// A load sample: the budget of the windows to come follows it as the rule says.
    fn observe(&mut self, s: &LoadSample) {
        self.budget.set_headroom(self.rule.headroom(s));
        self.samples += 1;
        self.busy_sum += s.busy_cores;
        self.spun_sum += s.spun_cores;
    }

    /// The datapath busy-waits from `now` until its next pass.
    fn spin_from(&mut self, now: Nanos) {
        self.spinning_since = Some(now);
    }

    /// What the datapath does at `now` after a pass that received nothing, with its next
    /// departure due at `deadline`: another pass at once (busy-waiting from `now` until the
    /// next call counts against the budget), or a `ppoll` with this timeout (None: until a
    /// frame, a job or a signal). It sleeps to `margin` before a departure and busy-waits the
    /// rest while the budget lasts, past it to the departure itself; under
    /// [`SpinRule::Always`] it never blocks, and polls with a zero timeout so that a stop
    /// signal or a job is still seen.
    fn next_wait(&mut self, now: Nanos, deadline: Option<Nanos>, margin: Nanos) -> Wait {
        match deadline {
            Some(d) if d <= now => Wait::Pass,
            _ if self.rule == SpinRule::Always => {
                self.spin_from(now);
                Wait::Poll(Some(0))
            }
            Some(d) if d <= now + margin && self.budget.may_spin() => {
                self.spin_from(now);
                Wait::Pass
            }
            Some(d) if d <= now + margin => Wait::Poll(Some(d - now)),
            Some(d) => Wait::Poll(Some(d - now - margin)),
            None => Wait::Poll(None),
        }
    }

    /// The load figures of the run, into the statistics.
    fn report(&self, stats: &mut DatapathStats) {
        stats.load_samples = self.samples;
        if self.samples > 0 {
            stats.machine_busy_cores = self.busy_sum / self.samples as f64;
            stats.spin_cores = self.spun_sum / self.samples as f64;
        }
    }
}

const BLOCK_SIZE: u32 = 1 << 16;

struct Ring {
    fd: RawFd,
    ifindex: i32,
    map: *mut u8,
    map_len: usize,
    frames: u32,
}

// SAFETY: the ring is used by one thread at a time (it is moved into the datapath thread).
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping the region we mapped and closing the socket we opened.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, self.map_len);
            libc::close(self.fd);
        }
    }
}

fn setsockopt<T>(
    fd: RawFd,
    level: i32,
    name: i32,
    val: &T,
    what: &str,
) -> Result<(), DatapathError> {
    // SAFETY: `val` points to a live value of the size we pass.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            val as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as u32,
        )
    };
    if r != 0 {
        return Err(os(what.to_string()));
    }
    Ok(())
}

fn ifindex(name: &str) -> Result<i32, DatapathError> {
    if name.contains('\0') {
        return Err(DatapathError::Os {
            what: format!("interface name {name:?}"),
            err: io::ErrorKind::InvalidInput.into(),
        });
    }
    crate::netns::interface_index(name)
        .map(|i| i as i32)
        .ok_or_else(|| DatapathError::Os {
            what: format!("interface {name} (in this network namespace)"),
            // what if_nametoindex says of a name it does not know
            err: io::Error::from_raw_os_error(libc::ENODEV),
        })
}

impl Ring {
    fn open(ifname: &str, frames: u32) -> Result<Ring, DatapathError> {
        let idx = ifindex(ifname)?;
        let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
        // SAFETY: plain socket creation.
        let fd =
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if fd < 0 {
            return Err(os(format!(
                "AF_PACKET socket for {ifname} (needs CAP_NET_RAW)"
            )));
        }
        let guard = FdGuard(fd);
        let v2: libc::c_int = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &v2,
            "PACKET_VERSION TPACKET_V2",
        )?;
        let per_block = BLOCK_SIZE / FRAME_SIZE;
        let blocks = frames.div_ceil(per_block).max(1);
        let req = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE,
            tp_block_nr: blocks,
            tp_frame_size: FRAME_SIZE,
            tp_frame_nr: blocks * per_block,
        };
        setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_RX_RING,
            &req,
            "PACKET_RX_RING",
        )?;
        let one: libc::c_int = 1;
        setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &one,
            "PACKET_IGNORE_OUTGOING",
        )?;
        setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &one,
            "PACKET_QDISC_BYPASS",
        )?;
        let map_len = (BLOCK_SIZE * blocks) as usize;
        // SAFETY: mapping the ring the kernel just allocated for this socket.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(os("mmap of the receive ring"));
        }
        // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = idx;
        // SAFETY: binding to a sockaddr_ll of the right size.
        let r = unsafe {
            libc::bind(
                fd,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r != 0 {
            // SAFETY: unmapping what we mapped above.
            unsafe { libc::munmap(map, map_len) };
            return Err(os(format!("binding to {ifname}")));
        }
        std::mem::forget(guard);
        Ok(Ring {
            fd,
            ifindex: idx,
            map: map as *mut u8,
            map_len,
            frames: blocks * per_block,
        })
    }

    fn header(&self, i: u32) -> *mut libc::tpacket2_hdr {
        // SAFETY: i < frames, so the offset stays inside the mapping.
        unsafe { self.map.add((i * FRAME_SIZE) as usize) as *mut libc::tpacket2_hdr }
    }

    fn status(&self, i: u32) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: tp_status is the first, 4-byte aligned field of the frame header; the kernel
        // and we access it as a 32-bit word.
        unsafe { &*(self.header(i) as *const std::sync::atomic::AtomicU32) }
    }

    fn ready(&self, i: u32) -> bool {
        self.status(i).load(std::sync::atomic::Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }

    fn drops(&self) -> u64 {
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as u32;
        // SAFETY: getsockopt writes at most `len` bytes into `st`.
        let r = unsafe {
            libc::getsockopt(
                self.fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if r == 0 {
            st.tp_drops as u64
        } else {
            0
        }
    }
}

struct FdGuard(RawFd);
impl Drop for FdGuard {
    fn drop(&mut self) {
        // SAFETY: closing a descriptor we own.
        unsafe { libc::close(self.0) };
    }
}

struct Pool {
    mem: Vec<u8>,
    len: Vec<u16>,
    free: Vec<u32>,
}

impl Pool {
    fn new(n: u32) -> Pool {
        // Zeroed allocation: pages are only touched when used.
        Pool {
            mem: vec![0u8; n as usize * FRAME_SIZE as usize],
            len: vec![0; n as usize],
            free: (0..n).rev().collect(),
        }
    }
    fn slot(&mut self, i: u32) -> &mut [u8] {
        let s = i as usize * FRAME_SIZE as usize;
        &mut self.mem[s..s + FRAME_SIZE as usize]
    }
    fn frame(&self, i: u32) -> &[u8] {
        let s = i as usize * FRAME_SIZE as usize;
        &self.mem[s..s + self.len[i as usize] as usize]
    }
}

/// Sends frames on a bound AF_PACKET socket with one `sendmmsg` per batch.
fn send_batch(fd: RawFd, ifindex: i32, frames: &[&[u8]]) -> (u64, u64) {
    if frames.is_empty() {
        return (0, 0);
    }
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = ifindex;
    sll.sll_halen = 6;
    let mut iov: Vec<libc::iovec> = frames
        .iter()
        .map(|f| libc::iovec {
            iov_base: f.as_ptr() as *mut libc::c_void,
            iov_len: f.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: msghdr is plain data; zeroed is valid, then filled in.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = &mut sll as *mut _ as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            h.msg_iov = v as *mut libc::iovec;
            h.msg_iovlen = 1;
            libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            }
        })
        .collect();
    let mut sent = 0usize;
    let mut errors = 0u64;
    while sent < msgs.len() {
        // SAFETY: msgs[sent..] are valid mmsghdr entries pointing at live buffers.
        let r =
            unsafe { libc::sendmmsg(fd, msgs[sent..].as_mut_ptr(), (msgs.len() - sent) as u32, 0) };
        if r <= 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // Skip the frame that failed and go on with the rest.
            errors += 1;
            sent += 1;
            continue;
        }
        sent += r as usize;
    }
    (sent as u64 - errors, errors)
}

/// Blocks SIGINT and SIGTERM in the calling thread (call before spawning threads, so all
/// inherit it) and returns a signalfd that becomes readable when one arrives.
pub fn block_stop_signals() -> io::Result<RawFd> {
    // SAFETY: sigset manipulation on a local set, then masking this thread and creating a
    // signalfd for the same set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// An eventfd the control side writes to wake the datapath.
#[derive(Clone, Copy, Debug)]
pub struct Waker(RawFd);

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker(fd))
    }
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a local u64 to our eventfd.
        unsafe { libc::write(self.0, &one as *const u64 as *const libc::c_void, 8) };
    }
    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a local u64 from our (non-blocking) eventfd.
        unsafe { libc::read(self.0, &mut v as *mut u64 as *mut libc::c_void, 8) };
    }
}

/// Configures the calling thread for timing: 1 ns timer slack, optional CPU, optional
/// SCHED_FIFO. Returns what could not be done, for a warning.
fn tune_thread(rt: Option<i32>, cpu: Option<usize>) -> Option<String> {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if let Some(c) = cpu {
        if let Err(e) = mimic_core::cpu::pin_current_thread(&[c]) {
            return Some(format!("pinning the datapath to CPU {c}: {e}"));
        }
    }
    if let Some(p) = rt {
        if let Err(e) = mimic_core::cpu::set_realtime(Some(p)) {
            return Some(format!("SCHED_FIFO priority {p} not granted: {e}"));
        }
    }
    None
}

/// What the datapath hands back when it stops.
pub struct Finished {
    pub engine: Engine<u32>,
    pub stats: DatapathStats,
}

/// Opens both interfaces (in the current network namespace) and returns a runner to move
/// onto the datapath thread. Opening first lets the caller report errors before it detaches.
pub struct Datapath {
    cfg: DatapathConfig,
    rings: [Ring; 2],
}

impl Datapath {
    pub fn open(cfg: DatapathConfig) -> Result<Datapath, DatapathError> {
        let c = Ring::open(&cfg.client_if, cfg.ring_frames)?;
        let s = Ring::open(&cfg.server_if, cfg.ring_frames)?;
        Ok(Datapath { cfg, rings: [c, s] })
    }

    /// Runs until a stop signal arrives on `signal_fd`, or a job sets `stop`.
    pub fn run(
        self,
        mut engine: Engine<u32>,
        jobs: Receiver<Job>,
        waker: Waker,
        signal_fd: Option<RawFd>,
    ) -> Finished {
        // a thread that never sleeps stays at normal priority (see SpinRule::Always)
        let rt = self
            .cfg
            .rt_priority
            .filter(|_| self.cfg.spin_rule != SpinRule::Always);
        if let Some(w) = tune_thread(rt, self.cfg.cpu) {
            tracing::warn!("{w}");
        }
        let rings = self.rings;
        let mut pool = Pool::new(self.cfg.buffers);
        let mut stats = DatapathStats::default();
        let mut actions: Vec<Action<u32>> = Vec::with_capacity(1024);
        let mut out_tokens: [Vec<u32>; 2] = [Vec::with_capacity(64), Vec::with_capacity(64)];
        let mut stop = false;
        let spin = self.cfg.spin_ns;
        let sides = [Side::Client, Side::Server];
        let mut offset = clock(libc::CLOCK_REALTIME) as i128 - mono_now() as i128;
        let mut iter: u64 = 0;
        let mut cursor = [0u32; 2];
        let mut spinner = Spinner::new(self.cfg.spin_rule, MachineLoad::new());
        let (started, cpu_at_start) = (mono_now(), thread_cpu_ns());
        let interrupted_at_start = Interruptions::now();
        while !stop {
            iter += 1;
            if iter.is_multiple_of(1024) {
                offset = clock(libc::CLOCK_REALTIME) as i128 - mono_now() as i128;
            }
            // Control jobs.
            while let Ok(job) = jobs.try_recv() {
                let now = mono_now();
                job(&mut Ctx {
                    engine: &mut engine,
                    stats: &stats,
                    now,
                    stop: &mut stop,
                });
            }
            if stop {
                break;
            }
            // Receive.
            let mut got = 0;
            for ri in 0..2 {
                let r = &rings[ri];
                for _ in 0..256 {
                    let i = cursor[ri];
                    if !r.ready(i) {
                        break;
                    }
                    let h = r.header(i);
                    // SAFETY: the kernel handed this frame to us (TP_STATUS_USER); its header
                    // and the data at tp_mac..tp_mac+tp_snaplen lie inside the frame slot.
                    let (frame, ts, outgoing, truncated) = unsafe {
                        let hdr = &*h;
                        let sll = (h as *const u8)
                            .add(libc::TPACKET_ALIGN(
                                std::mem::size_of::<libc::tpacket2_hdr>(),
                            )) as *const libc::sockaddr_ll;
                        let data = std::slice::from_raw_parts(
                            (h as *const u8).add(hdr.tp_mac as usize),
                            hdr.tp_snaplen as usize,
                        );
                        (
                            data,
                            hdr.tp_sec as u64 * 1_000_000_000 + hdr.tp_nsec as u64,
                            (*sll).sll_pkttype == libc::PACKET_OUTGOING,
                            hdr.tp_len != hdr.tp_snaplen,
                        )
                    };
                    if truncated {
                        // Larger than a ring slot: cannot be forwarded whole.
                        stats.oversize += 1;
                    } else if !outgoing {
                        got += 1;
                        stats.rx_frames[ri] += 1;
                        let now = mono_now();
                        let mut arrival = (ts as i128 - offset) as u64;
                        if arrival > now || now - arrival > 1_000_000_000 {
                            arrival = now;
                        }
                        record(
                            &mut stats.rx_wait_hist,
                            &mut stats.rx_wait_max_ns,
                            now - arrival,
                        );
                        handle_frame(
                            &mut engine,
                            &mut pool,
                            &mut stats,
                            &rings,
                            sides[ri],
                            frame,
                            arrival,
                        );
                    }
                    r.status(i)
                        .store(libc::TP_STATUS_KERNEL, std::sync::atomic::Ordering::Release);
                    cursor[ri] = (i + 1) % r.frames;
                }
            }
            // Departures.
            let now = mono_now();
            engine.poll(now, &mut actions);
            if !actions.is_empty() {
                let sent_at = mono_now();
                for a in actions.drain(..) {
                    match a {
                        Action::Send { token, out, due } => {
                            stats.record_late(sent_at.saturating_sub(due));
                            out_tokens[(out == Side::Server) as usize].push(token);
                        }
                        Action::Discard { token } => {
                            stats.discarded += 1;
                            pool.free.push(token);
                        }
                    }
                }
                for (oi, toks) in out_tokens.iter_mut().enumerate() {
                    for chunk in toks.chunks(64) {
                        let frames: Vec<&[u8]> = chunk.iter().map(|&t| pool.frame(t)).collect();
                        let (ok, err) = send_batch(rings[oi].fd, rings[oi].ifindex, &frames);
                        stats.tx_frames[oi] += ok;
                        stats.tx_errors += err;
                    }
                    pool.free.append(toks);
                }
            }
            if got > 0 {
                continue;
            }
            // Sleep until the next departure (less the spin margin), a frame, a job or a signal.
            let now = mono_now();
            // Spin budget (see `Spinner`): past it the datapath sleeps to the exact deadline.
            if spinner.update(now) {
                stats.spin_reduced_windows += 1;
            }
            let timeout = match spinner.next_wait(now, engine.next_deadline(), spin) {
                Wait::Pass => continue,
                Wait::Poll(t) => t,
            };
            let mut fds = [
                libc::pollfd {
                    fd: rings[0].fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: rings[1].fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: waker.0,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: signal_fd.unwrap_or(-1),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ts = timeout.map(|t| libc::timespec {
                tv_sec: (t / 1_000_000_000) as i64,
                tv_nsec: (t % 1_000_000_000) as i64,
            });
            let slept_at = mono_now();
            // SAFETY: fds is a valid array; the timespec (if any) outlives the call.
            let ready = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as u64,
                    ts.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                    std::ptr::null(),
                )
            };
            if let (0, Some(t)) = (ready, timeout) {
                if t > 0 {
                    stats.record_wake(mono_now().saturating_sub(slept_at + t));
                }
            }
            if fds[2].revents != 0 {
                waker.drain();
            }
            if fds[3].revents != 0 {
                stop = true;
            }
        }
        stats.ring_drops = rings.iter().map(|r| r.drops()).sum();
        spinner.report(&mut stats);
        let interrupted = Interruptions::now().since(interrupted_at_start);
        (stats.preempted, stats.page_faults) = (interrupted.preempted, interrupted.page_faults);
        stats.datapath_cores = thread_cpu_ns().saturating_sub(cpu_at_start) as f64
            / mono_now().saturating_sub(started).max(1) as f64;
        stats.finish();
        Finished { engine, stats }
    }
}

fn handle_frame(
    engine: &mut Engine<u32>,
    pool: &mut Pool,
    stats: &mut DatapathStats,
    rings: &[Ring; 2],
    side: Side,
    frame: &[u8],
    arrival: Nanos,
) {
    let out = (side == Side::Client) as usize; // client side frames go out on the server ring
    let Some(token) = pool.free.pop() else {
        stats.no_buffer += 1;
        return;
    };
    match engine.handle(arrival, side, frame, token) {
        Verdict::Forward => {
            pool.free.push(token);
            stats.forwarded_unshaped += 1;
            let (ok, err) = send_batch(rings[out].fd, rings[out].ifindex, &[frame]);
            stats.tx_frames[out] += ok;
            stats.tx_errors += err;
        }
        Verdict::Dropped(_) => {
            stats.pipe_drops += 1;
            pool.free.push(token);
        }
        Verdict::Scheduled(_) | Verdict::Held => {
            pool.slot(token)[..frame.len()].copy_from_slice(frame);
            pool.len[token as usize] = frame.len() as u16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_up_lateness_is_summarised_by_its_quantiles() {
        let mut s = DatapathStats::default();
        s.finish();
        assert_eq!(
            (s.wake_late_p99_ns, s.late_p99_ns, s.timed_sleeps),
            (0, 0, 0)
        );
        // 98 prompt wake-ups and two 0.7 ms late: the p99 is the late ones
        for _ in 0..98 {
            s.record_wake(2_300);
        }
        s.record_wake(700_000);
        s.record_wake(700_400);
        s.record_late(10_000);
        s.finish();
        assert_eq!(s.timed_sleeps, 100);
        assert_eq!(s.wake_late_max_ns, 700_400);
        // 1 µs buckets, upper bounds, never above the maximum
        assert_eq!(s.wake_late_p99_ns, 700_400);
        assert_eq!(quantile(&s.wake_hist, s.wake_late_max_ns, 0.5), 3_000);
        // departure lateness and ring wait keep their own histograms
        assert_eq!((s.late_p50_ns, s.late_p99_ns), (10_000, 10_000));
        assert_eq!((s.rx_wait_p99_ns, s.rx_wait_max_ns), (0, 0));
    }

    #[test]
    fn a_snapshot_has_the_finished_figures_without_the_histograms() {
        let mut s = DatapathStats::default();
        for ns in [1_500, 2_500, 80_000] {
            s.record_late(ns);
            s.record_wake(ns * 2);
            record(&mut s.rx_wait_hist, &mut s.rx_wait_max_ns, ns * 3);
        }
        s.rx_frames = [7, 9];
        s.machine_busy_cores = 1.25;
        let snap = s.snapshot();
        assert!(snap.late_hist.is_empty() && snap.wake_hist.is_empty());
        assert!(snap.rx_wait_hist.is_empty());
        assert_eq!(
            s.late_p99_ns, 0,
            "the datapath's own figures are left as they were"
        );
        let mut finished = s.clone();
        finished.finish();
        finished.late_hist.clear();
        finished.wake_hist.clear();
        finished.rx_wait_hist.clear();
        assert_eq!(snap, finished);
        assert_eq!(
            (snap.late_p99_ns, snap.wake_late_p99_ns, snap.rx_wait_p99_ns),
            (80_000, 160_000, 240_000)
        );
    }

    /// `/proc/stat`'s first line with `busy` ticks of user time and `idle` idle ticks.
    fn proc_stat(busy: u64, idle: u64) -> String {
        format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\n")
    }

    /// Feeds `spinner` the load of a 2-core machine (100 ticks a second) whose CPUs are
    /// `busy` cores busy, `spun` of them the datapath's busy-waiting, for 1 s in 200 ms
    /// samples, and returns the budget of the 10 ms window after it.
    fn budget_after(spinner: &mut Spinner, busy: f64, spun: f64) -> u64 {
        let (mut ticks, mut spun_ns) = (0.0, 0u64);
        for i in 0..=5u64 {
            let now = i * MachineLoad::INTERVAL_NS;
            let stat = proc_stat(ticks as u64, 0);
            if let Some(s) = spinner.load.sample_of(now, &stat, spun_ns) {
                spinner.observe(&s);
            }
            ticks += busy * 20.0;
            spun_ns += (spun * MachineLoad::INTERVAL_NS as f64) as u64;
        }
        spinner.budget.roll(2 * SPIN_WINDOW_NS);
        spinner.budget.roll(5 * SPIN_WINDOW_NS);
        spinner.budget.budget()
    }

    const FULL: u64 = SPIN_WINDOW_NS / 2;

    /// Issue 22: 50 kpps through 65,536 pipes on a quiet 2-core host keeps about 0.6 cores
    /// busy beside the datapath's spinning (its own forwarding, the generator, the receiver).
    /// The datapath of `mimic netemu run` keeps its whole budget there; the load-following
    /// rule, the default before, allowed it nothing (the added-delay error p99 1,604 µs
    /// against 45.3 µs).
    #[test]
    fn a_forwarding_datapath_keeps_its_spin_budget_under_its_own_load() {
        let rule = DatapathConfig::default().spin_rule;
        assert_eq!(rule, SpinRule::ROUTER);
        let mut s = Spinner::new(rule, MachineLoad::with(2, 100));
        assert_eq!(budget_after(&mut s, 0.8, 0.2), FULL);
        // and on a machine with no core to spare at all
        let mut s = Spinner::new(rule, MachineLoad::with(2, 100));
        assert_eq!(budget_after(&mut s, 2.0, 0.0), FULL);
        // the statistics say what the machine did
        let mut stats = DatapathStats::default();
        s.report(&mut stats);
        assert_eq!(stats.load_samples, 5);
        assert!((stats.machine_busy_cores - 2.0).abs() < 1e-9, "{stats:?}");
    }

    /// The replay's router shares the machine with the emulated clients and servers: its
    /// budget follows the rest of the machine's use (less its own spinning): whole while a
    /// core is idle beside it, none at 0.6 of a core or less, linear between.
    #[test]
    fn the_replays_datapath_gives_its_spin_budget_to_a_busy_machine() {
        assert_eq!(SpinRule::BESIDE_HOSTS, SpinRule::FollowLoad);
        for (busy, spun, want) in [
            (0.2, 0.2, FULL),
            (0.2, 0.0, FULL / 2),
            (0.5, 0.1, 0),
            (0.8, 0.2, 0),
            (1.9, 0.0, 0),
        ] {
            let mut s = Spinner::new(SpinRule::BESIDE_HOSTS, MachineLoad::with(2, 100));
            assert_eq!(
                budget_after(&mut s, busy, spun),
                want,
                "busy {busy}, spun {spun}"
            );
        }
    }

    /// The wait after an idle pass: busy-waiting within the margin while the budget lasts,
    /// sleeping to the margin before a departure or to the departure itself past the budget;
    /// a busy-polling datapath never blocks, whatever the machine does.
    #[test]
    fn each_rule_waits_for_a_departure_as_it_says() {
        const M: Nanos = 100_000;
        let t0 = 3 * SPIN_WINDOW_NS; // the start of a window
        let mut s = Spinner::new(SpinRule::Fixed, MachineLoad::with(2, 100));
        s.update(t0);
        assert_eq!(s.next_wait(t0, Some(t0), M), Wait::Pass);
        assert_eq!(s.next_wait(t0, Some(t0 + 40_000), M), Wait::Pass);
        assert_eq!(
            s.next_wait(t0, Some(t0 + 300_000), M),
            Wait::Poll(Some(200_000))
        );
        assert_eq!(s.next_wait(t0, None, M), Wait::Poll(None));
        // half the window spun: past the budget it sleeps to the departure itself
        s.update(t0 + FULL);
        assert_eq!(
            s.next_wait(t0 + FULL, Some(t0 + FULL + 40_000), M),
            Wait::Poll(Some(40_000))
        );
        for (busy, spun) in [(0.2, 0.2), (2.0, 1.0)] {
            let mut s = Spinner::new(SpinRule::Always, MachineLoad::with(2, 100));
            budget_after(&mut s, busy, spun);
            let now = 7 * SPIN_WINDOW_NS;
            for d in [Some(now + 300_000), Some(now + 40_000), None] {
                assert_eq!(s.next_wait(now, d, M), Wait::Poll(Some(0)), "{d:?}");
                s.update(now + SPIN_WINDOW_NS / 2 + 1);
            }
            assert_eq!(s.next_wait(now, Some(now), M), Wait::Pass);
        }
    }

    #[test]
    fn spin_rules_parse_and_print_as_the_command_line_has_them() {
        for r in [SpinRule::Fixed, SpinRule::FollowLoad, SpinRule::Always] {
            assert_eq!(r.to_string().parse::<SpinRule>(), Ok(r));
        }
        assert_eq!("load".parse::<SpinRule>(), Ok(SpinRule::FollowLoad));
        assert_eq!("always".parse::<SpinRule>(), Ok(SpinRule::Always));
        let e = "never".parse::<SpinRule>().unwrap_err();
        assert!(
            e.contains("`never`") && e.contains("fixed, load or always"),
            "{e}"
        );
    }
}
