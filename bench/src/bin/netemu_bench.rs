//! netemu-bench: forwarding rate and added-delay error of mimic's userspace datapath with 1,
//! 1,000 and 65,536 active pipes, side by side with plain kernel forwarding (tc mirred
//! redirect) and kernel tbf on the same veths of one lab.
//!
//! Traffic: a generator in NAME-cli sends small TCP frames (70 bytes, one flow per pipe,
//! round robin) on an AF_PACKET socket; frames are addressed to a MAC the server does not own,
//! so the server's kernel counts and drops them without answering.
//! * rate: the generator blasts with `sendmmsg` for a few seconds; the rate is what the
//!   server interface received (rx_packets) per second. Kernel forwarding runs in softirq and
//!   needs no thread of its own; mimic's datapath needs one, and on this 2-core machine it
//!   competes with the generator — that is part of the comparison.
//! * delay error: the generator paces packets and stamps CLOCK_REALTIME into each just before
//!   sending; a receiver in NAME-srv takes the kernel receive timestamp (SO_TIMESTAMPNS).
//!   error = |(rx - tx) - configured delay|, configured delay 5 ms for mimic, 0 for the kernel.
//!   Two phases: "paced" (10 kpps, one probe per flow round robin) and "load" (every frame
//!   timestamped, `--load-pps` round robin over all flows — with 65,536 flows and 5 ms of delay
//!   at 50 kpps about 250 pipes hold a packet at any instant and each pipe sees a packet every
//!   1.3 s). The blast phase has no timestamps: its rate is the forwarding figure.
//! * kernel tbf: one tbf qdisc on the server-side veth, shared by all flows (per-flow tbf would
//!   need an htb class, a tbf leaf and a hashed u32 filter per flow; not built here).
//! * mimic's datapath is restarted (same engine) for each phase, so the lateness and ring-drop
//!   counters in the notes belong to that phase.
//!
//! * kernel netem (`--netem`, on a kernel with sch_netem): one netem qdisc, delay 5 ms, on
//!   the server-side veth behind the mirred redirect, shared by all flows; its delay error
//!   beside mimic's in the same run (bench/netem-delay.sh runs it in a router guest).
//!
//! * spin rule (`--spin-rule load,fixed,always`, all three by default, alternating at each pipe count):
//!   mimic's datapath with the fixed half-window busy-wait budget (what `mimic netemu run`
//!   does by default) and with the budget following the machine's load (what the replay's
//!   lab router does, beside its clients and servers). Each row's notes give, per phase, the
//!   windows in which the budget was cut and what the machine used meanwhile: all CPUs' busy
//!   time, the datapath thread's CPU time, and its busy-waiting (cores).
//!   The third rule, `always` (in the default list too), busy-polls without a break at
//!   normal priority, for a datapath on a CPU of its own: it runs in the split layout only.
//! * layout (`--layout shared,split`, both by default where there are two CPUs, alternating
//!   within each spin rule; only `shared` on one CPU, as in bench/netem-delay.sh's guest):
//!   every thread where the scheduler puts it, or the datapath alone on the last CPU and the
//!   traffic threads on the others (the lab router's layout; `mimic netemu run --cpu N`). On a
//!   quiet 2-core host the split keeps the generator's softirq work and the receiver off the
//!   CPU a SCHED_FIFO datapath busy-waits on; on a host loaded by other work a pinned
//!   datapath cannot move off a CPU another task holds in the kernel (netemu/README.md).
//! * host: each row gives the 1-minute load average and the share of the phase in which some
//!   task waited for a CPU (`/proc/pressure/cpu`, "some") for the paced and load phases, the
//!   time the hypervisor stole from the most robbed vCPU in each (`/proc/stat`), and names other processes' real-time threads at or above the datapath's priority that ran
//!   during a phase, with their CPU time (a TCG guest's QEMU at FIFO 20 preempts the datapath;
//!   a warning on stderr too): such figures measure the machine, not the datapath.
//! * machine floor: just before each timed phase, a thread that does nothing but read the
//!   clock busy-polls the CPU the datapath will run on (the datapath's CPU in the split
//!   layout, wherever the scheduler puts it in the shared one) for `--floor-seconds` (default
//!   the phase's length, 0 turns it off), and every gap between two of its clock reads longer
//!   than 1 µs is a stall the machine imposed (timer ticks, interrupts, other tasks, the
//!   hypervisor). A departure due inside a stall cannot leave before the stall ends, so with
//!   departures due at instants spread evenly over the time, the share late by more than x is
//!   Σ max(0, gap − x) / span; the floor's p99 is the x at which that share is 1% — the added
//!   delay error a datapath that cost nothing would have at the 99th percentile on that CPU
//!   then, beside which the datapath's own p99 is to be read.
//!
//! * `--rps` (an experiment, off by default): the end hosts' veths steer their receive
//!   processing (RPS) to the traffic CPUs, so that what the datapath sends is not received on
//!   its own CPU (in its `sendmmsg` and in ksoftirqd beside it). Tried 2026-12-03 (bench/
//!   RESULTS.md): on 2 cores it cut the forwarding rate by a third to a half (all receiving
//!   lands on the generator's CPU), and that day's steal left its effect on the delay error
//!   unjudgeable.
//!
//! Usage: netemu-bench [--seconds S] [--floor-seconds S] [--out FILE.json] [--pipes 1,1000,65536] [--load-pps 50000] [--spin-rule load,fixed,always] [--netem] [--layout shared,split] [--rps]
//! Needs root. Prints a markdown table; writes JSON with --out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mimic_core::cpu::{steal_ms_per_cpu, Interruptions, ThreadStat};
use mimic_netemu::datapath::{
    mono_now, Datapath, DatapathConfig, DatapathStats, Finished, Job, SpinRule, Waker,
};
use mimic_netemu::engine::{Engine, FlowRule, Limits, PipeTable};
use mimic_netemu::lab::{self, LabInfo, LabOptions};
use mimic_netemu::netns;

const SRC_MAC: [u8; 6] = [0x02, 0x6d, 0x69, 0, 0, 0x01];
const DST_MAC: [u8; 6] = [0x02, 0x6d, 0x69, 0, 0, 0x99]; // owned by nobody: the server drops
const SERVER: [u8; 4] = [198, 18, 0, 9];
const FRAME_LEN: usize = 14 + 20 + 20 + 16;
const DELAY_NS: u64 = 5_000_000;
/// SCHED_FIFO priority of mimic's datapath thread here (`mimic netemu run`'s default).
const DATAPATH_PRIORITY: i32 = mimic_netemu::spec::DEFAULT_RT_PRIORITY;

/// Where the threads run (`--layout shared,split`, both by default, alternating per spin rule):
/// `shared`, every thread where the scheduler puts it; `split`, mimic's datapath alone on the
/// last allowed CPU and the generator, receiver and blaster on the others — the lab router's
/// layout (`mimic_core::cpu::lab_split`, `mimic netemu run --cpu N`). The kernel rows always
/// run shared (kernel forwarding needs no thread of its own).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Shared,
    Split,
}

/// The CPUs of the split layout: (the datapath's, the traffic threads').
static CPU_SPLIT: std::sync::OnceLock<(usize, Vec<usize>)> = std::sync::OnceLock::new();
/// The layout of the row being measured.
static SPLIT_NOW: AtomicBool = AtomicBool::new(false);

fn split() -> Option<&'static (usize, Vec<usize>)> {
    SPLIT_NOW
        .load(Ordering::Relaxed)
        .then(|| CPU_SPLIT.get())
        .flatten()
}

/// Pins the calling traffic thread (generator, receiver, blaster) off the datapath's CPU
/// while the split layout is measured.
fn pin_traffic_thread() {
    if let Some((_, rest)) = split() {
        mimic_core::cpu::pin_current_thread(rest).expect("pinning a traffic thread");
    }
}

fn flow(i: u32) -> ([u8; 4], u16) {
    let ip = u32::from_be_bytes([198, 19, 0, 0]) + 1 + i / 64;
    (ip.to_be_bytes(), 10_000 + (i % 64) as u16)
}

fn checksum(data: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

fn frame(i: u32) -> Vec<u8> {
    let (src, sport) = flow(i);
    let mut f = vec![0u8; FRAME_LEN];
    f[0..6].copy_from_slice(&DST_MAC);
    f[6..12].copy_from_slice(&SRC_MAC);
    f[12] = 0x08;
    let ip = &mut f[14..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((FRAME_LEN - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&SERVER);
    let c = checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let t = &mut ip[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&80u16.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x18;
    f
}

fn realtime() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn packet_socket(ifname: &str) -> RawFd {
    let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
    // SAFETY: plain socket calls; sockaddr_ll zeroed then filled.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto);
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let name = std::ffi::CString::new(ifname).unwrap();
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        assert!(sll.sll_ifindex > 0, "no interface {ifname}");
        let r = libc::bind(
            fd,
            &sll as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(r, 0, "bind {ifname}");
        let one: i32 = 1;
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &one as *const i32 as *const libc::c_void,
            4,
        );
        fd
    }
}

/// Blasts frames round robin over `n` flows for `secs`; returns frames sent.
fn blast(info: &LabInfo, n: u32, secs: f64) -> u64 {
    let ns = info.ns_cli.clone();
    let dev = info.cli_if.clone();
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        pin_traffic_thread();
        let fd = packet_socket(&dev);
        let frames: Vec<Vec<u8>> = (0..n).map(frame).collect();
        let mut sent = 0u64;
        let mut next = 0usize;
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(64);
        while Instant::now() < end {
            iov.clear();
            for _ in 0..64 {
                iov.push(libc::iovec {
                    iov_base: frames[next].as_ptr() as *mut libc::c_void,
                    iov_len: FRAME_LEN,
                });
                next = (next + 1) % frames.len();
            }
            let mut msgs: Vec<libc::mmsghdr> = iov
                .iter_mut()
                .map(|v| {
                    // SAFETY: msghdr is plain data; zeroed then pointed at a live iovec.
                    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                    h.msg_iov = v as *mut libc::iovec;
                    h.msg_iovlen = 1;
                    libc::mmsghdr {
                        msg_hdr: h,
                        msg_len: 0,
                    }
                })
                .collect();
            // SAFETY: msgs point at frames that outlive the call.
            let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as u32, 0) };
            if r > 0 {
                sent += r as u64;
            }
        }
        // SAFETY: closing our socket.
        unsafe { libc::close(fd) };
        sent
    })
    .join()
    .unwrap()
}

fn rx_packets(info: &LabInfo) -> u64 {
    let out = Command::new("ip")
        .args([
            "-n",
            &info.ns_srv,
            "-j",
            "-s",
            "link",
            "show",
            "dev",
            &info.srv_if,
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap()
}

/// Paced, timestamped frames round robin over `n` flows at `pps` for `secs` (one `send` per
/// frame, the CLOCK_REALTIME stamp taken just before it; behind schedule, frames go back to
/// back until caught up). Returns (frames sent, one-way latencies in ns of those received).
fn latency(info: &LabInfo, n: u32, pps: u64, secs: f64) -> (u64, Vec<u64>) {
    let (rns, rdev) = (info.ns_srv.clone(), info.srv_if.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    let rx = std::thread::spawn(move || {
        netns::enter(&rns).unwrap();
        pin_traffic_thread();
        let fd = packet_socket(&rdev);
        let one: i32 = 1;
        // SAFETY: setsockopt/recvmsg on our socket with buffers we own.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                &one as *const i32 as *const libc::c_void,
                4,
            );
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 100_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            let big: i32 = 64 << 20;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                &big as *const i32 as *const libc::c_void,
                4,
            );
        }
        ready_tx.send(()).unwrap();
        let mut lat = Vec::new();
        let mut buf = [0u8; 2048];
        let mut cbuf = [0u8; 256];
        while !stop2.load(Ordering::Relaxed) {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            // SAFETY: msghdr zeroed, then pointed at our buffers.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = cbuf.len();
            // SAFETY: recvmsg into the buffers described by h.
            let r = unsafe { libc::recvmsg(fd, &mut h, 0) };
            if r < FRAME_LEN as isize || buf[0..6] != DST_MAC {
                continue;
            }
            // SAFETY: walking the control messages the kernel wrote into cbuf.
            let rx_ts = unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h);
                let mut ts = None;
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == libc::SCM_TIMESTAMPNS
                    {
                        let t = *(libc::CMSG_DATA(c) as *const libc::timespec);
                        ts = Some(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64);
                    }
                    c = libc::CMSG_NXTHDR(&h, c);
                }
                ts
            };
            let tx_ts = u64::from_be_bytes(buf[54..62].try_into().unwrap());
            if let Some(rx) = rx_ts {
                if tx_ts != 0 && rx >= tx_ts {
                    lat.push(rx - tx_ts);
                }
            }
        }
        // SAFETY: closing our socket.
        unsafe { libc::close(fd) };
        lat
    });
    ready_rx.recv().unwrap();
    let (cns, cdev) = (info.ns_cli.clone(), info.cli_if.clone());
    let sent = std::thread::spawn(move || {
        netns::enter(&cns).unwrap();
        pin_traffic_thread();
        // SAFETY: timer slack for precise pacing sleeps.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let fd = packet_socket(&cdev);
        let mut frames: Vec<Vec<u8>> = (0..n).map(frame).collect();
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let mut next = 0usize;
        let mut sent = 0u64;
        while Instant::now() < end {
            let f = &mut frames[next];
            next = (next + 1) % n as usize;
            f[54..62].copy_from_slice(&realtime().to_be_bytes());
            // SAFETY: sending a live buffer on our bound socket.
            let r = unsafe { libc::send(fd, f.as_ptr() as *const libc::c_void, FRAME_LEN, 0) };
            if r > 0 {
                sent += 1;
            }
            let due = start + Duration::from_nanos(sent.max(1) * 1_000_000_000 / pps);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        // SAFETY: closing our socket.
        unsafe { libc::close(fd) };
        sent
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    (sent, rx.join().unwrap())
}

/// A thread of another process: name, scheduling policy (FIFO, RR, or None for a normal
/// one), real-time priority and the CPU time it had used (`/proc/PID/task/TID/schedstat`, ns).
#[derive(Clone, Debug)]
struct Thread {
    comm: String,
    policy: Option<&'static str>,
    priority: i32,
    cpu_ns: u64,
}

/// The threads of the other user-space processes, keyed by (pid, tid) (kernel threads such as
/// migration/N are the kernel's own, not a workload, and are left out).
fn other_threads() -> BTreeMap<(i32, i32), Thread> {
    let me = std::process::id() as i32;
    let mut out = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Some(mut thread) = std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|stat| parse_thread_stat(&stat))
            else {
                continue;
            };
            thread.cpu_ns = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_ascii_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            out.insert((pid, tid), thread);
        }
    }
    out
}

/// A user-space thread from its `/proc/PID/task/TID/stat` line (CPU time left at 0); None for
/// a kernel thread or a line that does not parse.
fn parse_thread_stat(stat: &str) -> Option<Thread> {
    let t = ThreadStat::parse(stat).filter(|t| !t.kernel_thread)?;
    Some(Thread {
        comm: t.comm,
        policy: match t.policy {
            libc::SCHED_FIFO => Some("FIFO"),
            libc::SCHED_RR => Some("RR"),
            _ => None,
        },
        priority: t.rt_priority,
        cpu_ns: 0,
    })
}

/// What other processes' real-time threads at `min_priority` or above ran between two
/// snapshots of [`other_threads`], by process, largest first (empty when none ran). Such a
/// thread takes the datapath's CPU whenever it runs there (a higher priority preempts the
/// datapath, an equal FIFO one is never preempted by it): a TCG guest's QEMU, another lab's
/// datapath. A thread that became real-time during the phase counts with all its CPU time
/// of the phase.
fn foreign_rt_ran(
    before: &BTreeMap<(i32, i32), Thread>,
    after: &BTreeMap<(i32, i32), Thread>,
    min_priority: i32,
) -> Vec<(String, u64)> {
    let mut by_proc: BTreeMap<(i32, String, &str, i32), u64> = BTreeMap::new();
    for (&(pid, tid), t) in after {
        let Some(policy) = t.policy.filter(|_| t.priority >= min_priority) else {
            continue;
        };
        // a thread missing from the first snapshot began during the phase
        let ran = t
            .cpu_ns
            .saturating_sub(before.get(&(pid, tid)).map_or(0, |b| b.cpu_ns));
        if ran > 0 {
            *by_proc
                .entry((pid, t.comm.clone(), policy, t.priority))
                .or_default() += ran;
        }
    }
    let mut v: Vec<(String, u64)> = by_proc
        .into_iter()
        .map(|((pid, comm, pol, prio), ns)| (format!("{comm}[{pid}] {pol} {prio}"), ns))
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    v
}

/// The kernel's CPU pressure: µs in which some runnable task waited for a CPU, in all
/// (`/proc/pressure/cpu`, "some ... total="); None without PSI.
fn cpu_pressure_us() -> Option<u64> {
    let t = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    let line = t.lines().find(|l| l.starts_with("some "))?;
    line.split_ascii_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The 1-minute load average (`/proc/loadavg`), NaN if unreadable.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_ascii_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Added-delay error of one timestamped phase.
#[derive(Default)]
struct Errors {
    pps: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    sent: u64,
    received: usize,
    /// The host's 1-minute load average at the end of the phase.
    load: f64,
    /// Share of the phase in which some task waited for a CPU (PSI "some"; NaN without PSI).
    cpu_wait: f64,
    /// CPU time foreign real-time threads at or above the datapath's priority ran during the
    /// phase, by process (see [`foreign_rt_ran`]).
    foreign_rt: Vec<(String, u64)>,
    /// Time the hypervisor ran something else on the most robbed of this VM's CPUs during the
    /// phase, ms (`/proc/stat` steal; 0 on bare metal). A vCPU descheduled by its host stops
    /// every thread on it, pinned or not: the trace of one 101 ms stall in the split layout
    /// showed no event at all on the datapath's CPU for its length.
    steal_ms: f64,
    /// The machine floor measured just before the phase (see [`Floor`]).
    floor: Option<Floor>,
}

impl Errors {
    fn json(&self) -> serde_json::Value {
        let rt: serde_json::Map<String, serde_json::Value> = self
            .foreign_rt
            .iter()
            .map(|(k, ns)| (k.clone(), serde_json::json!(*ns as f64 / 1e6)))
            .collect();
        serde_json::json!({"pps": self.pps, "err_p50_us": self.p50_us, "err_p99_us": self.p99_us,
            "err_max_us": self.max_us, "sent": self.sent, "received": self.received,
            "loadavg_1m": self.load, "cpu_pressure_some": self.cpu_wait, "foreign_rt_ms": rt,
            "steal_ms_max_cpu": self.steal_ms,
            "floor": self.floor})
    }
    /// Foreign real-time CPU time during the phase, for the notes ("" if none).
    fn foreign_note(&self, phase: &str) -> String {
        if self.foreign_rt.is_empty() {
            return String::new();
        }
        let v: Vec<String> = self
            .foreign_rt
            .iter()
            .map(|(k, ns)| format!("{k} ran {:.0} ms", *ns as f64 / 1e6))
            .collect();
        format!(
            "; {phase}: FOREIGN REAL-TIME THREADS at priority >= {DATAPATH_PRIORITY}: {}",
            v.join(", ")
        )
    }
    /// The machine floor before the phase, p99 µs ("-" when not measured).
    fn floor_p99(&self) -> String {
        self.floor
            .as_ref()
            .map_or("-".into(), |f| format!("{:.1}", f.p99_us))
    }
    fn cell(&self) -> String {
        format!(
            "{:.1} / {:.1} / {:.1}",
            self.p50_us, self.p99_us, self.max_us
        )
    }
}

/// Stalls shorter than this between two clock reads of the floor thread are its own loop.
const STALL_MIN_NS: u64 = 1_000;

/// What the machine alone took from a thread busy-polling a CPU (the doc comment at the top,
/// "machine floor").
#[derive(Clone, Debug, serde::Serialize)]
struct Floor {
    /// The CPU it ran on (None: wherever the scheduler put it).
    cpu: Option<usize>,
    seconds: f64,
    /// The added-delay error a datapath that cost nothing would have at the 99th and 99.9th
    /// percentile, µs.
    p99_us: f64,
    p999_us: f64,
    /// The longest stall, µs.
    max_stall_us: f64,
    /// Share of the time spent in stalls.
    stalled_share: f64,
    /// Stalls longer than 20 µs.
    stalls_over_20us: usize,
    /// Times the scheduler gave the CPU to another task meanwhile (the rest of the stalls
    /// are interrupts and the hypervisor).
    preempted: u64,
}

impl Floor {
    /// From the stalls (ns, any order) seen over `span_ns`.
    fn from_stalls(
        cpu: Option<usize>,
        mut stalls: Vec<u64>,
        span_ns: u64,
        preempted: u64,
    ) -> Floor {
        stalls.sort_unstable_by(|a, b| b.cmp(a));
        let q = |share: f64| floor_quantile(&stalls, span_ns, share) / 1e3;
        Floor {
            cpu,
            seconds: span_ns as f64 / 1e9,
            p99_us: q(0.01),
            p999_us: q(0.001),
            max_stall_us: stalls.first().copied().unwrap_or(0) as f64 / 1e3,
            stalled_share: stalls.iter().sum::<u64>() as f64 / span_ns.max(1) as f64,
            stalls_over_20us: stalls.iter().filter(|&&g| g > 20_000).count(),
            preempted,
        }
    }
}

/// The lateness (ns) exceeded by a share `share` of departures due at instants spread evenly
/// over `span_ns`, when nothing can leave during the stalls `desc` (sorted longest first): a
/// departure due `d` before a stall of length g ends is `d` late, so the share late by more
/// than x is S(x) / span with S(x) = Σ max(0, g − x); S falls as x grows, and the answer is
/// the x with S(x) = share · span (0 when the stalls do not add up to that share).
fn floor_quantile(desc: &[u64], span_ns: u64, share: f64) -> f64 {
    let target = share * span_ns as f64;
    let mut prefix = 0.0;
    for (k, &g) in desc.iter().enumerate() {
        prefix += g as f64;
        let n = (k + 1) as f64;
        // with the k+1 longest stalls counted, S(x) = prefix − n·x for x down to the next one
        let lower = desc.get(k + 1).copied().unwrap_or(0) as f64;
        if prefix - n * lower >= target {
            return ((prefix - target) / n).max(lower);
        }
    }
    0.0
}

/// Busy-polls the clock for `secs` on `cpu` (None: unpinned) at normal priority and measures
/// the machine floor there.
fn machine_floor(cpu: Option<usize>, secs: f64) -> Floor {
    std::thread::spawn(move || {
        if let Some(c) = cpu {
            mimic_core::cpu::pin_current_thread(&[c]).expect("pinning the floor thread");
        }
        // touched up front, so that recording a stall takes no page fault of its own
        let mut stalls = vec![1u64; 1 << 20];
        let mut n = 0usize;
        let interrupted = Interruptions::now();
        let start = mono_now();
        let end = start + (secs * 1e9) as u64;
        let mut prev = start;
        loop {
            let t = mono_now();
            let gap = t - prev;
            prev = t;
            if gap > STALL_MIN_NS && n < stalls.len() {
                stalls[n] = gap;
                n += 1;
            }
            if t >= end {
                break;
            }
        }
        stalls.truncate(n);
        let preempted = Interruptions::now().since(interrupted).preempted;
        Floor::from_stalls(cpu, stalls, prev - start, preempted)
    })
    .join()
    .expect("floor thread")
}

struct Row {
    name: String,
    pipes: u32,
    sent_pps: f64,
    rx_pps: f64,
    paced: Errors,
    loaded: Errors,
    note: String,
}

fn errors(sent: u64, lat: &[u64], configured: u64, secs: f64) -> Errors {
    let mut e: Vec<u64> = lat.iter().map(|&l| l.abs_diff(configured)).collect();
    e.sort_unstable();
    let mut r = Errors {
        pps: sent as f64 / secs,
        sent,
        received: lat.len(),
        load: loadavg(),
        cpu_wait: f64::NAN,
        foreign_rt: Vec::new(),
        steal_ms: 0.0,
        floor: None,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        max_us: f64::NAN,
    };
    if !e.is_empty() {
        let q = |p: f64| e[((e.len() as f64 * p) as usize).min(e.len() - 1)] as f64 / 1e3;
        (r.p50_us, r.p99_us, r.max_us) = (q(0.5), q(0.99), *e.last().unwrap() as f64 / 1e3);
    }
    r
}

/// What is being measured: `start` before and `stop` after each phase (mimic's datapath is
/// restarted per phase so that its lateness and ring-drop counters are per phase).
trait Forwarder {
    fn start(&mut self) {}
    fn stop(&mut self) -> Option<DatapathStats> {
        None
    }
}

struct Kernel;
impl Forwarder for Kernel {}

struct Phases {
    paced: Option<DatapathStats>,
    loaded: Option<DatapathStats>,
    blast: Option<DatapathStats>,
}

/// How long each phase runs, the load phase's rate and how long the machine floor is
/// measured before each timed phase (0: not measured).
#[derive(Clone, Copy)]
struct PhaseTimes {
    secs: f64,
    load_pps: u64,
    floor_secs: f64,
}

/// Three phases over `pipes` flows: paced probes at 10 kpps, timestamped load at `load_pps`,
/// then the blast for the forwarding rate.
fn measure(
    info: &LabInfo,
    fwd: &mut dyn Forwarder,
    name: &str,
    pipes: u32,
    configured: u64,
    times: PhaseTimes,
) -> (Row, Phases) {
    let PhaseTimes {
        secs,
        load_pps,
        floor_secs,
    } = times;
    let mut timed = |pps: u64| {
        // the machine floor on the CPU the datapath is about to take, before it starts
        let floor = (floor_secs > 0.0).then(|| machine_floor(split().map(|s| s.0), floor_secs));
        fwd.start();
        let threads0 = other_threads();
        let (psi0, t0, steal0) = (cpu_pressure_us(), Instant::now(), steal_ms_per_cpu());
        let (sent, lat) = latency(info, pipes, pps, secs);
        let mut e = errors(sent, &lat, configured, secs);
        e.floor = floor;
        e.steal_ms = steal_ms_per_cpu()
            .iter()
            .zip(&steal0)
            .map(|(b, a)| b - a)
            .fold(0.0, f64::max);
        if let (Some(a), Some(b)) = (psi0, cpu_pressure_us()) {
            e.cpu_wait = b.saturating_sub(a) as f64 / 1e6 / t0.elapsed().as_secs_f64();
        }
        e.foreign_rt = foreign_rt_ran(&threads0, &other_threads(), DATAPATH_PRIORITY);
        if !e.foreign_rt.is_empty() {
            eprintln!(
                "netemu-bench: WARNING: {name}, {pipes} flows, {pps} pps: other processes' real-time threads took the CPU during the phase{}",
                e.foreign_note("")
            );
        }
        (e, fwd.stop())
    };
    let (paced, paced_stats) = timed(10_000);
    let (loaded, loaded_stats) = timed(load_pps);
    fwd.start();
    let before = rx_packets(info);
    let t = Instant::now();
    let sent = blast(info, pipes, secs);
    std::thread::sleep(Duration::from_millis(50));
    let got = rx_packets(info) - before;
    let el = t.elapsed().as_secs_f64() - 0.05;
    let blast_stats = fwd.stop();
    (
        Row {
            name: name.into(),
            pipes,
            sent_pps: sent as f64 / el,
            rx_pps: got as f64 / el,
            paced,
            loaded,
            note: String::new(),
        },
        Phases {
            paced: paced_stats,
            loaded: loaded_stats,
            blast: blast_stats,
        },
    )
}

/// mimic's datapath, in-process on its own thread in NAME-emu.
struct Mimic {
    info: LabInfo,
    spin_rule: SpinRule,
    engine: Option<Engine<u32>>,
    running: Option<(mpsc::Sender<Job>, Waker, std::thread::JoinHandle<Finished>)>,
}

impl Forwarder for Mimic {
    fn start(&mut self) {
        let engine = self.engine.take().expect("engine");
        let (jtx, jrx) = mpsc::channel::<Job>();
        let waker = Waker::new().unwrap();
        let ns = self.info.ns_emu.clone();
        let (ci, si) = (self.info.emu_cli_if.clone(), self.info.emu_srv_if.clone());
        let spin_rule = self.spin_rule;
        let dp = std::thread::spawn(move || {
            netns::enter(&ns).unwrap();
            let d = Datapath::open(DatapathConfig {
                client_if: ci,
                server_if: si,
                rt_priority: Some(DATAPATH_PRIORITY),
                spin_rule,
                cpu: split().map(|s| s.0),
                ..Default::default()
            })
            .unwrap();
            d.run(engine, jrx, waker, None)
        });
        std::thread::sleep(Duration::from_millis(200));
        self.running = Some((jtx, waker, dp));
    }
    fn stop(&mut self) -> Option<DatapathStats> {
        let (jtx, waker, dp) = self.running.take()?;
        jtx.send(Box::new(|ctx| *ctx.stop = true)).unwrap();
        waker.wake();
        let fin = dp.join().unwrap();
        self.engine = Some(fin.engine);
        Some(fin.stats)
    }
}

fn tc(ns: &str, args: &str) {
    let o = Command::new("tc")
        .arg("-n")
        .arg(ns)
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "tc {args}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Sets the receive packet steering CPU mask of `dev`'s first receive queue in namespace `ns`
/// (sysfs is the namespace's own under `ip netns exec`).
fn set_rps(ns: &str, dev: &str, mask: u64) {
    let write = format!("echo {mask:x} > /sys/class/net/{dev}/queues/rx-0/rps_cpus");
    let o = netns::command(ns, "sh", ["-c", write.as_str()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "rps_cpus of {dev} in {ns}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn kernel_redirect(info: &LabInfo, on: bool) {
    let (a, b) = (&info.emu_cli_if, &info.emu_srv_if);
    if on {
        for (x, y) in [(a, b), (b, a)] {
            tc(&info.ns_emu, &format!("qdisc add dev {x} ingress"));
            tc(&info.ns_emu, &format!("filter add dev {x} parent ffff: protocol all u32 match u32 0 0 action mirred egress redirect dev {y}"));
        }
    } else {
        for x in [a, b] {
            tc(&info.ns_emu, &format!("qdisc del dev {x} ingress"));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "netemu-bench: mimic's datapath beside kernel forwarding and tbf (needs root; builds a lab)\n\
             usage: netemu-bench [--seconds S] [--floor-seconds S] [--pipes 1,1000,65536] [--load-pps N] \
             [--spin-rule load,fixed,always] [--layout shared,split] [--netem] [--rps] [--out FILE]\n\
             bench/netemu.sh runs it; the doc comment of bench/src/bin/netemu_bench.rs says what each phase measures"
        );
        return;
    }
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let secs: f64 = get("--seconds").map(|s| s.parse().unwrap()).unwrap_or(3.0);
    let out = get("--out");
    let floor_secs: f64 = get("--floor-seconds")
        .map(|s| s.parse().unwrap())
        .unwrap_or(secs);
    let pipe_counts: Vec<u32> = get("--pipes")
        .unwrap_or("1,1000,65536".into())
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    let load_pps: u64 = get("--load-pps")
        .map(|s| s.parse().unwrap())
        .unwrap_or(50_000);
    let times = PhaseTimes {
        secs,
        load_pps,
        floor_secs,
    };
    let netem = args.iter().any(|a| a == "--netem");
    let allowed = mimic_core::cpu::allowed_cpus().unwrap_or_else(|e| {
        eprintln!("netemu-bench: the CPUs this process may use: {e}");
        std::process::exit(1)
    });
    let asked = get("--layout");
    // the default: both layouts where there are two CPUs to split, else the shared one (a
    // one-vCPU router guest, bench/netem-delay.sh)
    let default_layout = match mimic_core::cpu::lab_split(&allowed) {
        Some(_) => "shared,split",
        None => "shared",
    };
    let mut layouts = Vec::new();
    for l in asked.as_deref().unwrap_or(default_layout).split(',') {
        layouts.push(match l {
            "shared" => Layout::Shared,
            "split" => Layout::Split,
            x => {
                eprintln!(
                    "netemu-bench: --layout {x}: expected shared, split or both (shared,split)"
                );
                std::process::exit(2);
            }
        });
    }
    if layouts.contains(&Layout::Split) {
        let Some(sp) = mimic_core::cpu::lab_split(&allowed) else {
            eprintln!("netemu-bench --layout split: needs at least two CPUs, has {allowed:?}");
            std::process::exit(2);
        };
        CPU_SPLIT.set(sp).expect("set once");
    }
    let mut spin_rules = Vec::new();
    for r in get("--spin-rule")
        .as_deref()
        .unwrap_or("load,fixed,always")
        .split(',')
    {
        spin_rules.push(match r {
            "load" => ("spin follows load, the replay's", SpinRule::FollowLoad),
            "fixed" => ("fixed spin budget, the default", SpinRule::Fixed),
            "always" => ("busy-polls always, at normal priority", SpinRule::Always),
            x => {
                eprintln!(
                    "netemu-bench: --spin-rule {x}: expected load, fixed, always or a list (load,fixed)"
                );
                std::process::exit(2);
            }
        });
    }
    if netem {
        if let Err(e) = mimic_netemu::render::probe_netem() {
            eprintln!("netemu-bench --netem: {e}");
            std::process::exit(2);
        }
    }
    let name = format!("nb{}", std::process::id() % 100_000);
    let (info, _) = lab::up(
        &name,
        &LabOptions {
            owner: Some(lab::Owner::current()),
            ..Default::default()
        },
    )
    .expect("lab up (needs root)");
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = lab::down(&self.0);
        }
    }
    let _down = Down(name.clone());
    if args.iter().any(|a| a == "--rps") {
        // the end hosts' receive processing of what the datapath sends, steered (RPS) to the
        // traffic CPUs: without it the veth peer's receive path runs on the sending CPU, in
        // the datapath's own `sendmmsg` and in ksoftirqd beside it
        let Some((dp, rest)) = mimic_core::cpu::lab_split(&allowed) else {
            eprintln!("netemu-bench --rps: needs at least two CPUs, has {allowed:?}");
            std::process::exit(2);
        };
        let mask: u64 = rest.iter().map(|&c| 1u64 << c).sum();
        for (ns, dev) in [(&info.ns_srv, &info.srv_if), (&info.ns_cli, &info.cli_if)] {
            set_rps(ns, dev, mask);
        }
        eprintln!(
            "netemu-bench: RPS on {} and {}: CPUs {rest:?} (the datapath's: {dp})",
            info.srv_if, info.cli_if
        );
    }
    let mut rows: Vec<Row> = Vec::new();

    // Plain kernel forwarding: tc mirred redirect between the emu veths.
    kernel_redirect(&info, true);
    for &n in &pipe_counts {
        let (mut row, _) = measure(
            &info,
            &mut Kernel,
            "kernel forwarding (tc mirred)",
            n,
            0,
            times,
        );
        row.note = "flows, no pipes".into();
        rows.push(row);
    }
    // Kernel tbf on the server-side veth (rate far above what is offered: its cost, not a
    // limit). One tbf qdisc shared by all flows: per-flow tbf would need an htb class, a tbf
    // leaf and a hashed u32 filter per flow (65,536 of each), which this bench does not build.
    tc(
        &info.ns_emu,
        &format!(
            "qdisc add dev {} root tbf rate 10gbit burst 1mb latency 50ms",
            info.emu_srv_if
        ),
    );
    for &n in &pipe_counts {
        let (mut row, _) = measure(
            &info,
            &mut Kernel,
            "kernel tbf 10gbit + mirred",
            n,
            0,
            times,
        );
        row.note = "flows through one shared tbf, no delay".into();
        rows.push(row);
    }
    tc(
        &info.ns_emu,
        &format!("qdisc del dev {} root", info.emu_srv_if),
    );
    // Kernel netem (--netem; needs sch_netem, e.g. in a router guest on Debian's stock
    // kernel: bench/netem-delay.sh): one netem qdisc with the same 5 ms delay on the
    // server-side veth, shared by all flows, limit far above what is in flight.
    if netem {
        tc(
            &info.ns_emu,
            &format!(
                "qdisc add dev {} root netem delay {}us limit 1000000",
                info.emu_srv_if,
                DELAY_NS / 1_000
            ),
        );
        for &n in &pipe_counts {
            let (mut row, _) = measure(
                &info,
                &mut Kernel,
                "kernel netem delay=5ms + mirred",
                n,
                DELAY_NS,
                times,
            );
            row.note = "flows through one shared netem".into();
            rows.push(row);
        }
        tc(
            &info.ns_emu,
            &format!("qdisc del dev {} root", info.emu_srv_if),
        );
    }
    kernel_redirect(&info, false);

    for &n in &pipe_counts {
        let server: SocketAddr = SocketAddr::new(SERVER.into(), 80);
        let table = PipeTable {
            flows: (0..n)
                .map(|i| {
                    let (ip, port) = flow(i);
                    FlowRule {
                        client: SocketAddr::new(ip.into(), port),
                        server,
                        up: "delay=5ms".parse().unwrap(),
                        down: "delay=5ms".parse().unwrap(),
                    }
                })
                .collect(),
            ..Default::default()
        };
        // the rules alternate at each pipe count, so that they meet the same host load
        for (&(rule_name, spin_rule), &layout) in spin_rules
            .iter()
            .flat_map(|r| layouts.iter().map(move |l| (r, l)))
            // busy-polling is for a CPU of its own: shared, it would take the traffic
            // threads' CPU for good
            .filter(|&((_, r), l)| *r != SpinRule::Always || *l == Layout::Split)
        {
            SPLIT_NOW.store(layout == Layout::Split, Ordering::Relaxed);
            let where_ = match (layout, CPU_SPLIT.get()) {
                (Layout::Split, Some((dp, rest))) => format!(
                    ", datapath alone on CPU {dp}, traffic on {}",
                    mimic_core::cpu::format_list(rest)
                ),
                _ => String::new(),
            };
            let t = Instant::now();
            let engine: Engine<u32> = Engine::new(&table, Limits::default(), 1).unwrap();
            let setup_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut m = Mimic {
                info: info.clone(),
                spin_rule,
                engine: Some(engine),
                running: None,
            };
            let (mut row, ph) = measure(
                &info,
                &mut m,
                &format!("mimic netemu (delay=5ms per pipe, {rule_name}{where_})"),
                n,
                DELAY_NS,
                times,
            );
            let late = |s: &Option<DatapathStats>| {
                let s = s.as_ref().unwrap();
                format!(
                    "lateness p99/max {:.0}/{:.0} µs, ring wait p99/max {:.0}/{:.0} µs, wake-up late p99/max {:.0}/{:.0} µs of {} timed sleeps, spin cut in {} of 10 ms windows, machine busy {:.2} cores (datapath {:.2}, spinning {:.2}), its CPU given to another task {} times, page faults {}, ring drops {}, no-buffer {}",
                    s.late_p99_ns as f64 / 1e3,
                    s.late_max_ns as f64 / 1e3,
                    s.rx_wait_p99_ns as f64 / 1e3,
                    s.rx_wait_max_ns as f64 / 1e3,
                    s.wake_late_p99_ns as f64 / 1e3,
                    s.wake_late_max_ns as f64 / 1e3,
                    s.timed_sleeps,
                    s.spin_reduced_windows,
                    s.machine_busy_cores,
                    s.datapath_cores,
                    s.spin_cores,
                    s.preempted,
                    s.page_faults,
                    s.ring_drops,
                    s.no_buffer
                )
            };
            row.note = format!(
                "{} pipes, built in {setup_ms:.0} ms; paced: {}; load: {}; blast: {}",
                2 * n,
                late(&ph.paced),
                late(&ph.loaded),
                late(&ph.blast)
            );
            rows.push(row);
            SPLIT_NOW.store(false, Ordering::Relaxed);
        }
    }

    let kernel_pps = |n: u32| {
        rows.iter()
            .find(|r| r.name.starts_with("kernel forwarding") && r.pipes == n)
            .unwrap_or(&rows[0])
            .rx_pps
    };
    println!("Delay error = |actual - configured| one-way, µs, p50 / p99 / max. paced: 10 kpps, one probe per flow round robin; load: all frames timestamped at {load_pps} pps round robin over all flows; blast: forwarding rate, no timestamps. vs kernel fwd: forwarded pps / kernel forwarding's with the same number of flows. floor p99: the error a datapath that cost nothing would have had at the 99th percentile, from the stalls a thread busy-polling the datapath's CPU (any CPU in the shared layout) met just before the phase (bench/src/bin/netemu_bench.rs, \"machine floor\").\n");
    println!("| datapath | active pipes | blast offered pps | forwarded pps | vs kernel fwd | error, paced 10 kpps | error under load (achieved pps) | received / sent under load | host load (paced / load) | notes |");
    println!("|---|---:|---:|---:|---:|---|---|---:|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0}% | {} | {} ({:.0}) | {} / {} | {:.2} / {:.2} (CPU wait {:.0}% / {:.0}%, steal {:.0} / {:.0} ms, floor p99 {} / {} µs) | {}{}{} |",
            r.name,
            r.pipes,
            r.sent_pps,
            r.rx_pps,
            100.0 * r.rx_pps / kernel_pps(r.pipes),
            r.paced.cell(),
            r.loaded.cell(),
            r.loaded.pps,
            r.loaded.received,
            r.loaded.sent,
            r.paced.load,
            r.loaded.load,
            100.0 * r.paced.cpu_wait,
            100.0 * r.loaded.cpu_wait,
            r.paced.steal_ms,
            r.loaded.steal_ms,
            r.paced.floor_p99(),
            r.loaded.floor_p99(),
            r.note,
            r.paced.foreign_note("paced"),
            r.loaded.foreign_note("load")
        );
    }
    if let Some(o) = out {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({"datapath": r.name, "pipes": r.pipes, "offered_pps": r.sent_pps, "forwarded_pps": r.rx_pps, "vs_kernel_forwarding": r.rx_pps / kernel_pps(r.pipes), "paced": r.paced.json(), "loaded": r.loaded.json(), "note": r.note}))
            .collect();
        std::fs::write(&o, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stat line with `flags`, real-time priority and policy set, every other field 0
    /// (mimic_core::cpu::ThreadStat's tests parse real ones).
    fn stat_line(comm: &str, flags: u64, priority: i32, policy: i32) -> String {
        let mut f = vec!["0".to_string(); 50];
        f[6] = flags.to_string();
        f[37] = priority.to_string();
        f[38] = policy.to_string();
        format!("1347 ({comm}) S {}", f[1..].join(" "))
    }

    #[test]
    fn user_threads_are_named_with_their_policy_and_kernel_threads_left_out() {
        let t = parse_thread_stat(&stat_line("qemu-system-x86", 0x40_0140, 20, 1)).unwrap();
        assert_eq!(
            (t.comm.as_str(), t.policy, t.priority),
            ("qemu-system-x86", Some("FIFO"), 20)
        );
        let t = parse_thread_stat(&stat_line("rr", 0, 5, 2)).unwrap();
        assert_eq!(t.policy, Some("RR"));
        let t = parse_thread_stat(&stat_line("a (b) c", 0, 0, 0)).unwrap();
        assert_eq!((t.comm.as_str(), t.policy), ("a (b) c", None));
        assert!(parse_thread_stat(&stat_line("kworker/0:1", 0x0020_0040, 0, 0)).is_none());
        assert!(parse_thread_stat("1 (x) S 1 2").is_none());
    }

    #[test]
    fn foreign_real_time_use_is_the_growth_of_threads_at_or_above_the_priority() {
        let th = |comm: &str, policy, priority, cpu_ns| Thread {
            comm: comm.into(),
            policy,
            priority,
            cpu_ns,
        };
        let before = BTreeMap::from([
            ((7, 7), th("qemu", Some("FIFO"), 20, 1_000_000)),
            ((7, 8), th("qemu", Some("FIFO"), 20, 5_000_000)),
            ((9, 9), th("timer", Some("FIFO"), 1, 0)),
            ((11, 11), th("cc1", None, 0, 0)),
        ]);
        let after = BTreeMap::from([
            ((7, 7), th("qemu", Some("FIFO"), 20, 4_000_000)),
            ((7, 8), th("qemu", Some("FIFO"), 20, 5_000_000)),
            // a thread that appeared during the phase counts with all its time
            ((7, 12), th("qemu", Some("FIFO"), 20, 2_000_000)),
            // below the priority, or normal, does not count
            ((9, 9), th("timer", Some("FIFO"), 1, 9_000_000)),
            ((11, 11), th("cc1", None, 0, 9_000_000)),
            // an equal priority does (FIFO peers do not preempt each other)
            ((13, 13), th("netemu-datapath", Some("FIFO"), 10, 500_000)),
            ((14, 14), th("idle-rt", Some("RR"), 50, 0)),
        ]);
        assert_eq!(
            foreign_rt_ran(&before, &after, 10),
            vec![
                ("qemu[7] FIFO 20".to_string(), 5_000_000),
                ("netemu-datapath[13] FIFO 10".to_string(), 500_000),
            ]
        );
        assert!(foreign_rt_ran(&after, &after, 10).is_empty());
    }
    /// S(x) = Σ max(0, g − x), the time in which a departure due would be late by more than x.
    fn late_time(stalls: &[u64], x: f64) -> f64 {
        stalls.iter().map(|&g| (g as f64 - x).max(0.0)).sum()
    }

    #[test]
    fn the_floor_is_the_lateness_a_share_of_evenly_spread_departures_exceeds() {
        // no stalls, or too few to make up the share: nothing need be late
        assert_eq!(floor_quantile(&[], 1_000_000_000, 0.01), 0.0);
        assert_eq!(floor_quantile(&[100_000], 1_000_000_000, 0.01), 0.0);
        // one 1 ms stall in 10 ms: 1% of the departures (0.1 ms of due times) fall in its
        // first 0.1 ms and are late by 0.9 ms or more
        assert_eq!(floor_quantile(&[1_000_000], 10_000_000, 0.01), 900_000.0);
        // 300 and 100 µs in 10 ms (sorted longest first)
        let d = [300_000, 100_000];
        assert_eq!(floor_quantile(&d, 10_000_000, 0.01), 200_000.0);
        assert_eq!(floor_quantile(&d, 10_000_000, 0.02), 100_000.0);
        assert_eq!(floor_quantile(&d, 10_000_000, 0.03), 50_000.0);
        // random stalls: the answer makes up exactly the share, and the floor grows as the
        // share shrinks
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let n = 1 + round % 50;
            let mut stalls: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    1_000 + x % 2_000_000
                })
                .collect();
            stalls.sort_unstable_by(|a, b| b.cmp(a));
            let span = 100_000_000;
            let mut last = 0.0;
            for share in [0.05, 0.01, 0.001] {
                let f = floor_quantile(&stalls, span, share);
                let want = share * span as f64;
                if f > 0.0 {
                    assert!(
                        (late_time(&stalls, f) - want).abs() < 1e-3 * want,
                        "{stalls:?} {share}"
                    );
                } else {
                    assert!(late_time(&stalls, 0.0) <= want);
                }
                assert!(f >= last && f <= stalls[0] as f64);
                last = f;
            }
        }
    }

    #[test]
    fn a_floor_sums_up_its_stalls() {
        let f = Floor::from_stalls(
            Some(1),
            vec![5_000, 40_000, 2_000, 1_000_000],
            2_000_000_000,
            3,
        );
        assert_eq!(f.preempted, 3);
        assert_eq!(f.cpu, Some(1));
        assert_eq!(f.seconds, 2.0);
        assert_eq!(f.max_stall_us, 1_000.0);
        assert_eq!(f.stalls_over_20us, 2);
        assert!((f.stalled_share - 1_047_000.0 / 2e9).abs() < 1e-12);
        // 1% of 2 s is 20 ms, more than all the stalls: a free datapath would be on time
        assert_eq!(f.p99_us, 0.0);
        // 0.1% is 2 ms: still more than the stalls; 0.01% of 2 s (0.2 ms) would not be
        assert_eq!(f.p999_us, 0.0);
        assert_eq!(
            floor_quantile(&[1_000_000, 40_000, 5_000, 2_000], 2_000_000_000, 0.0001),
            800_000.0
        );
    }
}
