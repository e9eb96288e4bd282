//! CPU affinity and load: which CPUs this process may run on, pinning the calling thread, CPU
//! lists in the `taskset -c` syntax (`0,2-3`), and a busy-wait budget that follows the load of
//! the machine.
//!
//! The lab keeps the network emulator's SCHED_FIFO datapath on a CPU of its own and the
//! client and server emulators' timer threads off it: a real-time datapath preempts whatever
//! shares its CPU, and its syscalls carry the emulated hosts' TCP processing, so a timer
//! thread beside it waits behind that work. Measured at 1,000 concurrent connections on
//! 2 cores: server delays p99 0.17-0.56 ms late with the split (four runs), 1.1-2.1 ms without
//! (seven runs; bench/RESULTS.md, Scale).

use std::io;

/// The CPUs the calling thread may run on (its affinity mask), in ascending order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills the set we own.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: the index is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Restricts the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "empty CPU list",
        ));
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET only writes inside it (indices checked).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {c} is beyond the largest CPU number this build handles"),
            ));
        }
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // the kernel ignores CPUs of the list that are offline or absent, and refuses the list
    // with a bare EINVAL only when none is left: name the ones that cannot be used
    if let Some(on) = online_cpus() {
        let absent: Vec<usize> = cpus.iter().copied().filter(|c| !on.contains(c)).collect();
        if !absent.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} {} {} not online on this machine (online: {})",
                    if absent.len() == 1 { "CPU" } else { "CPUs" },
                    format_list(&absent),
                    if absent.len() == 1 { "is" } else { "are" },
                    format_list(&on)
                ),
            ));
        }
    }
    // SAFETY: pid 0 is the calling thread; the set is initialised.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) {
            // online but outside this process's cpuset (a container or a cgroup's limit)
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "CPU {} is outside the CPUs this process's cgroup allows{}",
                    format_list(cpus),
                    allowed_cpus()
                        .map(|a| format!(" (it runs on {})", format_list(&a)))
                        .unwrap_or_default()
                ),
            ));
        }
        return Err(e);
    }
    Ok(())
}

/// The CPUs online on this machine (`/sys/devices/system/cpu/online`), or `None` where that
/// cannot be read.
pub fn online_cpus() -> Option<Vec<usize>> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    parse_list(s.trim()).ok()
}

/// Parses a CPU list: comma-separated CPU numbers and ranges, e.g. `0`, `0,2-3`.
pub fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |x: &str| {
            let c = x
                .trim()
                .parse::<usize>()
                .map_err(|_| format!("`{x}` in CPU list `{s}` is not a CPU number"))?;
            // (a range up to a huge number would also be a huge list)
            if c >= libc::CPU_SETSIZE as usize {
                return Err(format!(
                    "CPU {c} in CPU list `{s}`: CPU numbers go up to {}",
                    libc::CPU_SETSIZE - 1
                ));
            }
            Ok(c)
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range `{part}` in CPU list `{s}` runs backwards"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Formats CPUs as a list [`parse_list`] reads back, with runs as ranges.
pub fn format_list(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// How a lab shares the CPUs it may use: the datapath alone on the last one, the timer threads
/// on the rest. None with fewer than two CPUs (nothing to split).
pub fn lab_split(allowed: &[usize]) -> Option<(usize, Vec<usize>)> {
    let (&last, rest) = allowed.split_last()?;
    (!rest.is_empty()).then(|| (last, rest.to_vec()))
}

/// How much of each window a timing thread may busy-wait before its deadlines. Spinning makes
/// deadlines exact while the machine has CPU to spare; on a loaded machine it takes the CPU that
/// the rest of the replay (clients, servers, the kernel's per-CPU work) needs to keep its own
/// timing. So the budget follows the headroom [`MachineLoad`] reports: the whole maximum while
/// a core is left idle beside the spinner's, nothing at 0.6 of a core or less, linear between.
/// The network emulator's datapath and the emulators' timer threads each keep one.
#[derive(Debug)]
pub struct SpinBudget {
    window_ns: u64,
    max: u64,
    window: u64,
    /// Busy-waited so far in this window, and in all.
    spun: u64,
    spun_total: u64,
    budget: u64,
    /// Cores the rest of the machine left idle beside the spinner's (last sample).
    headroom: f64,
}

impl SpinBudget {
    pub const ROOM_FULL: f64 = 1.0;
    pub const ROOM_NONE: f64 = 0.6;

    /// At most `max_ns` of busy-waiting in each window of `window_ns`.
    pub fn new(window_ns: u64, max_ns: u64) -> SpinBudget {
        SpinBudget {
            window_ns: window_ns.max(1),
            max: max_ns,
            window: 0,
            spun: 0,
            spun_total: 0,
            budget: max_ns,
            headroom: Self::ROOM_FULL,
        }
    }

    pub fn add_spin(&mut self, ns: u64) {
        self.spun += ns;
        self.spun_total += ns;
    }

    /// Busy-waiting in all (what [`MachineLoad::headroom`] subtracts).
    pub fn spun_total(&self) -> u64 {
        self.spun_total
    }

    /// The headroom for the budgets of the windows to come.
    pub fn set_headroom(&mut self, headroom: f64) {
        self.headroom = headroom;
    }

    /// This window's budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Starts a new window if `now_ns` is past the current one; true if that window's budget
    /// is cut for lack of headroom.
    pub fn roll(&mut self, now_ns: u64) -> bool {
        let w = now_ns / self.window_ns;
        if w == self.window {
            return false;
        }
        self.budget = self.budget_for(self.headroom);
        self.window = w;
        self.spun = 0;
        self.budget < self.max
    }

    fn budget_for(&self, headroom: f64) -> u64 {
        let f =
            ((headroom - Self::ROOM_NONE) / (Self::ROOM_FULL - Self::ROOM_NONE)).clamp(0.0, 1.0);
        (self.max as f64 * f).round() as u64
    }

    pub fn may_spin(&self) -> bool {
        self.spun < self.budget
    }
}

/// When a timing thread may run with real-time priority: while it is light. On this
/// platform's kernel (EEVDF, 250 Hz tick) a normal thread whose sleep ends while another
/// normal thread runs is often let in only when that one's slice ends at the next tick:
/// traced in the lab's light replay, the timer thread waited 1-4 ms behind a busy tokio worker
/// of another emulator, behind ksoftirqd and once behind khugepaged (nice 19), which kept
/// about 1% of the server's delays more than 1 ms late. A 100 µs EEVDF slice request and nice
/// −20 leave the tick-long waits (a thread woken on a CPU with three busy ones: 1% over 1 ms
/// either way); SCHED_FIFO ends them (at most 91 µs). But busy real-time timer threads take
/// the CPU from the tasks that feed them: at 1,000 connections on 2 cores, with the two
/// emulators' timer threads real-time for up to 3 ms of each 10 ms, starts were p99 15.6 ms
/// late (0.49-2.15 ms with normal scheduling), and budgets by the machine's headroom were no
/// better than the rule below (p99 0.48-1.2 ms for server delays, four runs).
/// So a thread is real-time in a window only if it used less than `max` CPU time in the window
/// before and has not used that much in this one: a light thread always, a busy one never.
#[derive(Debug)]
pub struct RtBudget {
    window_ns: u64,
    max: u64,
    window: u64,
    /// The thread's CPU time when this window began.
    cpu_at_window: u64,
    /// Whether the window before this one stayed under `max`.
    light_before: bool,
}

impl RtBudget {
    /// Real-time while under `max_ns` of CPU time per window of `window_ns`.
    pub fn new(window_ns: u64, max_ns: u64) -> RtBudget {
        RtBudget {
            window_ns: window_ns.max(1),
            max: max_ns,
            window: 0,
            cpu_at_window: 0,
            light_before: true,
        }
    }

    /// Whether the current window is still under `max`, with the thread at `cpu_ns` in all.
    fn light_so_far(&self, cpu_ns: u64) -> bool {
        cpu_ns.saturating_sub(self.cpu_at_window) < self.max
    }

    fn roll(&mut self, now_ns: u64, cpu_ns: u64) {
        let w = now_ns / self.window_ns;
        if w != self.window {
            // a window with no call in between was idle
            self.light_before = w > self.window + 1 || self.light_so_far(cpu_ns);
            self.window = w;
            self.cpu_at_window = cpu_ns;
        }
    }

    /// Whether the thread may be real-time at `now_ns` (any monotonic clock), having used
    /// `cpu_ns` of CPU time in all.
    pub fn may_run(&mut self, now_ns: u64, cpu_ns: u64) -> bool {
        self.roll(now_ns, cpu_ns);
        self.light_before && self.light_so_far(cpu_ns)
    }

    /// Whether a thread about to sleep from `now_ns` until `wake_ns` may wake real-time: in
    /// this window as [`RtBudget::may_run`] says; in a later one if this window stays light.
    pub fn may_wake(&mut self, now_ns: u64, wake_ns: u64, cpu_ns: u64) -> bool {
        let now_rt = self.may_run(now_ns, cpu_ns);
        if wake_ns / self.window_ns == self.window {
            now_rt
        } else {
            self.light_so_far(cpu_ns)
        }
    }
}

/// CPU time the calling thread has used, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    // SAFETY: clock_gettime writes one timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What interrupted the calling thread so far (`getrusage(RUSAGE_THREAD)`): the times the
/// scheduler gave its CPU to another task while it could have run (involuntary context
/// switches), and its minor page faults. A busy-polling thread should see neither grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interruptions {
    pub preempted: u64,
    pub page_faults: u64,
}

impl Interruptions {
    pub fn now() -> Interruptions {
        // SAFETY: getrusage fills one rusage we own.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) } != 0 {
            return Interruptions::default();
        }
        Interruptions {
            preempted: r.ru_nivcsw as u64,
            page_faults: r.ru_minflt as u64,
        }
    }

    /// What happened between `earlier` and this reading.
    pub fn since(self, earlier: Interruptions) -> Interruptions {
        Interruptions {
            preempted: self.preempted.saturating_sub(earlier.preempted),
            page_faults: self.page_faults.saturating_sub(earlier.page_faults),
        }
    }
}

/// Runs the calling thread SCHED_FIFO at `priority`, or with normal scheduling (SCHED_OTHER)
/// for None.
pub fn set_realtime(priority: Option<i32>) -> io::Result<()> {
    let (policy, p) = match priority {
        Some(p) => (libc::SCHED_FIFO, p),
        None => (libc::SCHED_OTHER, 0),
    };
    let param = libc::sched_param { sched_priority: p };
    // SAFETY: pid 0 is the calling thread; the param is initialised.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Time the hypervisor ran something else on each of this machine's CPUs so far (steal), ms:
/// field 8 of `/proc/stat`'s `cpuN` lines, in clock ticks (`sysconf(_SC_CLK_TCK)` a second);
/// 0 on bare metal, empty where unreadable. A vCPU descheduled by its host stops every thread
/// on it, pinned or real-time alike.
pub fn steal_ms_per_cpu() -> Vec<f64> {
    // SAFETY: sysconf reads a constant of the system
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ms_per_tick = 1000.0 / if hz > 0 { hz as f64 } else { 100.0 };
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .nth(8)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
                * ms_per_tick
        })
        .collect()
}

/// A thread as `/proc/PID/task/TID/stat` shows it: its name, whether it is a kernel thread,
/// its scheduling policy (`libc::SCHED_OTHER`, `SCHED_FIFO`, ...) and real-time priority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadStat {
    pub comm: String,
    pub kernel_thread: bool,
    pub policy: i32,
    pub rt_priority: i32,
}

impl ThreadStat {
    /// Parses one stat line; None for a line that does not have the fields of proc(5).
    pub fn parse(stat: &str) -> Option<ThreadStat> {
        let open = stat.find('(')?;
        // the name may hold spaces and parentheses: it ends at the last ')'
        let (head, rest) = stat.rsplit_once(')')?;
        // the fields after the name start at field 3 (state): flags is field 9, rt_priority
        // field 40, policy field 41
        let f: Vec<&str> = rest.split_ascii_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<i64>().ok());
        const PF_KTHREAD: i64 = 0x0020_0000;
        let (flags, prio, policy) = (num(6)?, num(37)?, num(38)?);
        Some(ThreadStat {
            comm: head.get(open + 1..)?.to_string(),
            kernel_thread: flags & PF_KTHREAD != 0,
            policy: i32::try_from(policy).ok()?,
            rt_priority: i32::try_from(prio).ok()?,
        })
    }

    /// The threads of process `pid` by thread id (those whose stat cannot be read, having
    /// exited meanwhile, are left out).
    pub fn of_process(pid: u32) -> io::Result<Vec<(u32, ThreadStat)>> {
        let mut out = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some(st) = std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|s| ThreadStat::parse(&s))
            {
                out.push((tid, st));
            }
        }
        Ok(out)
    }
}

/// Samples, every `INTERVAL`, how many cores the machine used apart from the caller's
/// busy-waiting: all CPUs' busy time (`/proc/stat`) less the time the caller spent spinning.
/// The caller's real work counts as load (the datapath's syscalls, for one, carry the veth
/// peers' TCP processing), and so does every other process's: `/proc/stat` cannot tell a
/// traffic generator from the emulated clients and servers of a replay.
pub struct MachineLoad {
    cpus: f64,
    tick_ns: f64,
    last: Option<(u64, u64, u64)>,
}

/// One [`MachineLoad`] sample: what the machine used over the last interval, in cores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSample {
    /// All CPUs' busy time (user, nice, system, irq, softirq, steal) per wall time.
    pub busy_cores: f64,
    /// The caller's busy-waiting per wall time (part of `busy_cores`).
    pub spun_cores: f64,
    /// Cores the rest of the machine left idle beside the caller's own: CPUs − 1 − (busy −
    /// spun). What [`SpinBudget::set_headroom`] takes.
    pub headroom: f64,
}

impl Default for MachineLoad {
    fn default() -> Self {
        MachineLoad::new()
    }
}

impl MachineLoad {
    pub const INTERVAL_NS: u64 = 200_000_000;

    pub fn new() -> MachineLoad {
        // SAFETY: sysconf has no memory effects.
        let (cpus, hz) = unsafe {
            (
                libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
                libc::sysconf(libc::_SC_CLK_TCK),
            )
        };
        MachineLoad::with(cpus.max(1) as usize, hz.max(1) as u64)
    }

    /// A machine of `cpus` CPUs whose `/proc/stat` counts `hz` ticks a second.
    pub fn with(cpus: usize, hz: u64) -> MachineLoad {
        MachineLoad {
            cpus: cpus.max(1) as f64,
            tick_ns: 1e9 / hz.max(1) as f64,
            last: None,
        }
    }

    /// Cores left idle beside the caller's own, when a new sample is due (`now_ns` on any
    /// monotonic clock) and `/proc/stat` is readable. `spun_ns`: the caller's busy-waiting so
    /// far, in all.
    pub fn headroom(&mut self, now_ns: u64, spun_ns: u64) -> Option<f64> {
        self.sample(now_ns, spun_ns).map(|s| s.headroom)
    }

    /// The whole sample behind [`MachineLoad::headroom`], when one is due.
    pub fn sample(&mut self, now_ns: u64, spun_ns: u64) -> Option<LoadSample> {
        if !self.due(now_ns) {
            return None;
        }
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        self.sample_of(now_ns, &stat, spun_ns)
    }

    /// Whether a sample is due at `now_ns`.
    pub fn due(&self, now_ns: u64) -> bool {
        self.last
            .is_none_or(|(t, _, _)| now_ns >= t + Self::INTERVAL_NS)
    }

    /// A sample from `stat`, the text of `/proc/stat` read at `now_ns` (None for the first
    /// one, or text that does not parse).
    pub fn sample_of(&mut self, now_ns: u64, stat: &str, spun_ns: u64) -> Option<LoadSample> {
        let busy = (busy_ticks(stat)? as f64 * self.tick_ns) as u64;
        let prev = self.last.replace((now_ns, busy, spun_ns));
        let (t0, b0, s0) = prev?;
        let dt = now_ns.saturating_sub(t0).max(1) as f64;
        let busy_cores = busy.saturating_sub(b0) as f64 / dt;
        let spun_cores = spun_ns.saturating_sub(s0) as f64 / dt;
        let others = (busy_cores - spun_cores).max(0.0);
        Some(LoadSample {
            busy_cores,
            spun_cores,
            headroom: self.cpus - 1.0 - others,
        })
    }
}

/// Busy ticks of all CPUs from `/proc/stat`'s first line (everything but idle and iowait).
fn busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().next()?;
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).filter_map(|x| x.parse().ok()).collect();
    if v.len() < 8 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    Some(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_list_stays_within_the_cpu_numbers() {
        assert_eq!(parse_list("0,2-3"), Ok(vec![0, 2, 3]));
        let e = parse_list("0-1000000000000").unwrap_err();
        assert!(
            e.contains("CPU 1000000000000 in CPU list") && e.contains("go up to 1023"),
            "{e}"
        );
    }

    #[test]
    fn pinning_to_a_cpu_that_is_not_online_names_it() {
        let online = online_cpus().expect("/sys/devices/system/cpu/online is readable");
        let beyond = online.iter().max().unwrap() + 1;
        // refused before the thread's affinity changes
        let e = pin_current_thread(&[beyond]).unwrap_err().to_string();
        assert!(
            e.contains(&format!("CPU {beyond} is not online")) && e.contains("online: "),
            "{e}"
        );
        let e = pin_current_thread(&[online[0], beyond, beyond + 1])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("CPUs {}-{} are not online", beyond, beyond + 1)),
            "{e}"
        );
    }

    #[test]
    fn a_thread_counts_its_own_page_faults() {
        let before = Interruptions::now();
        // 64 fresh pages of our own, each written once: a fault each, in this thread only
        let n = 64 * 4096;
        // SAFETY: an anonymous private mapping we own, written within its length, then unmapped.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
            for i in (0..n).step_by(4096) {
                std::ptr::write_volatile(p.add(i), 1);
            }
            libc::munmap(p as *mut libc::c_void, n);
        }
        let d = Interruptions::now().since(before);
        assert!(d.page_faults >= 64, "{d:?}");
        // another thread's faults are not ours
        let before = Interruptions::now();
        std::thread::spawn(|| vec![1u8; 1 << 22].iter().map(|&b| b as u64).sum::<u64>())
            .join()
            .unwrap();
        assert!(Interruptions::now().since(before).page_faults < 64);
    }

    // a TCG guest's QEMU vCPU thread at SCHED_FIFO 20, as /proc showed it
    const QEMU: &str = "1347 (qemu-system-x86) S 1 1341 1341 0 -1 138412224 13094 0 5 0 1213 183 0 0 -21 0 3 0 3393228 2352021504 96989 18446744073709551615 94012161396736 94012167257173 140727290332864 0 0 0 2147220087 3674112 16451 1 0 0 -1 0 20 1 0 0 0 94012170369272 94012175573424 94013173366784 140727290341146 140727290342085 140727290342085 140727290343388 0";

    #[test]
    fn thread_stat_lines_give_name_policy_and_priority() {
        let t = ThreadStat::parse(QEMU).unwrap();
        assert_eq!(
            (t.comm.as_str(), t.kernel_thread, t.policy, t.rt_priority),
            ("qemu-system-x86", false, libc::SCHED_FIFO, 20)
        );
        // a name with spaces and parentheses; normal policy
        let odd = QEMU
            .replace("(qemu-system-x86)", "(a (b) c)")
            .replace(" 20 1 0 0 0 ", " 0 0 0 0 0 ");
        let t = ThreadStat::parse(&odd).unwrap();
        assert_eq!((t.comm.as_str(), t.policy), ("a (b) c", libc::SCHED_OTHER));
        // a kernel thread (PF_KTHREAD), and what does not parse
        let kthread = QEMU.replace(" 138412224 ", " 2129984 ");
        assert!(ThreadStat::parse(&kthread).unwrap().kernel_thread);
        assert!(ThreadStat::parse("1 (x) S 1 2").is_none());
        assert!(ThreadStat::parse("").is_none());
    }

    #[test]
    fn steal_is_read_for_every_cpu_line() {
        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        let steal = steal_ms_per_cpu();
        assert_eq!(steal.len(), cpus);
        assert!(
            steal.iter().all(|&s| s >= 0.0 && s.is_finite()),
            "{steal:?}"
        );
    }

    #[test]
    fn this_process_has_a_thread_at_normal_scheduling() {
        let threads = ThreadStat::of_process(std::process::id()).unwrap();
        let main = threads
            .iter()
            .find(|(tid, _)| *tid == std::process::id())
            .expect("the main thread");
        assert_eq!(main.1.policy, libc::SCHED_OTHER);
        assert!(!main.1.kernel_thread);
    }

    #[test]
    fn lists_parse_and_format_like_taskset() {
        assert_eq!(parse_list("0").unwrap(), vec![0]);
        assert_eq!(parse_list("3,0-2, 2").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(format_list(&[5, 0, 1, 2, 7, 8]), "0-2,5,7-8");
        assert_eq!(parse_list(&format_list(&[1, 3, 4])).unwrap(), vec![1, 3, 4]);
        assert!(parse_list("2-1").unwrap_err().contains("backwards"));
        assert!(parse_list("a").unwrap_err().contains("not a CPU number"));
        assert!(parse_list("").is_err());
    }

    #[test]
    fn the_lab_split_leaves_the_datapath_a_cpu_of_its_own() {
        assert_eq!(lab_split(&[0, 1]), Some((1, vec![0])));
        assert_eq!(lab_split(&[0, 2, 5]), Some((5, vec![0, 2])));
        assert_eq!(lab_split(&[3]), None);
        assert_eq!(lab_split(&[]), None);
    }

    #[test]
    fn a_thread_pinned_to_one_allowed_cpu_reports_only_that_cpu() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let last = *allowed.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(&[last]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![last]);
        })
        .join()
        .unwrap();
        assert!(pin_current_thread(&[]).is_err());
    }

    const W: u64 = 10_000_000;

    #[test]
    fn spin_budget_follows_the_machines_headroom() {
        for (room, want) in [
            (1.5, W / 2),
            (1.0, W / 2),
            (0.8, W / 4),
            (0.6, 0),
            (-0.5, 0),
        ] {
            let mut b = SpinBudget::new(W, W / 2);
            b.roll(10 * W);
            b.set_headroom(room);
            // the new budget applies from the next window on
            assert_eq!(b.budget(), W / 2);
            assert_eq!(b.roll(11 * W), want < W / 2);
            assert_eq!(b.budget(), want, "headroom {room}");
            assert_eq!(b.may_spin(), want > 0);
            b.spun = want;
            assert!(!b.may_spin());
        }
    }

    #[test]
    fn rt_budget_keeps_a_light_thread_real_time_and_a_busy_one_normal() {
        let mut b = RtBudget::new(W, W / 20);
        // window 5 begins with the thread at 7 ms of CPU in all
        let c = 7_000_000;
        assert!(b.may_run(5 * W, c));
        assert!(b.may_run(5 * W + 1, c + W / 20 - 1));
        // spent: normal for the rest of the window, and for a sleep that ends in it
        assert!(!b.may_run(5 * W + 2, c + W / 20));
        assert!(!b.may_wake(5 * W + 3, 6 * W - 1, c + W / 20));
        // and the next window too, for this one was busy
        assert!(!b.may_wake(5 * W + 3, 6 * W, c + W / 20));
        assert!(!b.may_run(6 * W, c + W / 20));
        // a light window (6) makes the next (7) real-time again
        assert!(!b.may_run(6 * W + 1, c + W / 20 + 1));
        assert!(b.may_wake(6 * W + 2, 7 * W, c + W / 20 + 2));
        assert!(b.may_run(7 * W, c + W / 20 + 2));
        // after windows with no call at all (idle), real-time
        assert!(!b.may_run(7 * W + 1, c + W));
        assert!(b.may_run(9 * W, c + W));
        // a budget of nothing is never real-time
        let mut none = RtBudget::new(W, 0);
        assert!(!none.may_run(3 * W, 0));
        assert!(!none.may_wake(3 * W, 4 * W + 1, 0));
    }

    #[test]
    fn thread_cpu_time_grows_with_work_not_with_sleep() {
        use std::time::{Duration, Instant};
        let t0 = thread_cpu_ns();
        std::thread::sleep(Duration::from_millis(20));
        let slept = thread_cpu_ns() - t0;
        assert!(slept < 5_000_000, "{slept} ns of CPU in a 20 ms sleep");
        // spinning adds CPU time (within 10 s of wall time even on a loaded machine)
        let (t1, give_up) = (thread_cpu_ns(), Instant::now() + Duration::from_secs(10));
        while thread_cpu_ns() < t1 + 5_000_000 {
            assert!(
                Instant::now() < give_up,
                "5 ms of spinning never showed as CPU time"
            );
            std::hint::spin_loop();
        }
    }

    #[test]
    fn busy_ticks_of_proc_stat() {
        let stat = "cpu  100 5 50 1000 7 3 2 1 0 0\ncpu0 50 2 25 500 3 1 1 0 0 0\n";
        assert_eq!(busy_ticks(stat), Some(100 + 5 + 50 + 3 + 2 + 1));
        assert_eq!(busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(busy_ticks("cpu 1 2 3\n"), None);
        assert_eq!(busy_ticks(""), None);
        // and the real one parses
        let real = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
        assert!(busy_ticks(&real).is_some());
    }

    /// `/proc/stat`'s first line with `busy` ticks of user time and `idle` ticks idle.
    fn stat(busy: u64, idle: u64) -> String {
        format!("cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    }

    #[test]
    fn machine_load_counts_all_busy_time_but_the_callers_spinning() {
        // 2 CPUs, 100 ticks a second: 0.2 s apart, 4 ticks busy = 0.2 cores busy
        let mut m = MachineLoad::with(2, 100);
        assert!(m.due(0));
        assert_eq!(m.sample_of(0, &stat(1000, 5000), 0), None);
        assert!(!m.due(MachineLoad::INTERVAL_NS - 1));
        let s = m.sample_of(200_000_000, &stat(1004, 5036), 0).unwrap();
        assert!((s.busy_cores - 0.2).abs() < 1e-9, "{s:?}");
        assert!((s.headroom - 0.8).abs() < 1e-9, "{s:?}");
        // 0.6 cores busy, of which the caller spun 0.1 (20 ms): the rest used 0.5
        let s = m
            .sample_of(400_000_000, &stat(1016, 5064), 20_000_000)
            .unwrap();
        assert!((s.busy_cores - 0.6).abs() < 1e-9, "{s:?}");
        assert!((s.spun_cores - 0.1).abs() < 1e-9, "{s:?}");
        assert!((s.headroom - 0.5).abs() < 1e-9, "{s:?}");
        // text that is not /proc/stat gives no sample and keeps the last one
        assert_eq!(m.sample_of(600_000_000, "nonsense", 0), None);
    }
}
