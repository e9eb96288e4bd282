//! Sub-millisecond timing for async tasks. Tokio's timer wheel has millisecond granularity
//! (and fires up to a tick late), and a task woken on time still waits for a worker thread to
//! run it, which on a loaded machine takes milliseconds. So the server emulator's response and
//! query delays, the client's request times and its connection starts are kept by one
//! dedicated thread that does the timed act itself: at the deadline it runs a short job (a
//! `connect`, or a non-blocking `send` of the bytes that are due) and hands the result back to
//! the waiting task, which carries on with whatever could not be done without blocking.
//!
//! The thread sleeps with a 1 ns timer slack until shortly before the earliest deadline and
//! spins the rest, within a budget (at most a quarter of each 10 ms window, and less as the
//! machine gets busy: [`SpinBudget`]) so that dense deadlines cannot make it spin without end
//! and its spinning does not take the CPU the rest of the replay needs. (At 1,000 concurrent
//! connections on 2 cores, with the lab's CPU split: server delays p99 0.54-0.56 ms late with
//! a fixed quarter, two runs; 0.17-0.56 ms with the budget following the load, four runs,
//! where the median is 12 µs late because nothing spins; 1 µs in a light replay.)
//! [`HrTimer::pin`] keeps it off the CPU of the network emulator's real-time datapath. It
//! runs SCHED_FIFO (lowest priority, below the datapath) while it is light, under 5% of a CPU,
//! and normal scheduling while it is busy ([`RtBudget`]): a normal thread whose sleep ends is
//! often let onto a busy CPU only at the next scheduler tick, up to 4 ms late, while busy
//! real-time timer threads take the CPU the tasks that feed them need. (Light replay, 320
//! connections: server delays p99 0.02-0.16 ms in six runs, at most one per run more than
//! 1 ms late (up to 1.5 ms), where 1-4 were in each of six runs before, up to 5.6 ms; at
//! 1,000 connections no difference through the noise, five runs each: p99 0.43-2.30 ms
//! against 0.41-1.74 ms, see the README.) Measured error: see the server's delay statistics,
//! the client's start lateness and bench/replay-scale.sh.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender, TryRecvError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mimic_core::cpu::{self, MachineLoad, RtBudget, SpinBudget};
use tokio::sync::oneshot;

/// Time before a deadline spent spinning instead of sleeping.
const SPIN: Duration = Duration::from_micros(200);
/// Spinning may take at most this share of each window (less on a busy machine).
const SPIN_WINDOW: Duration = Duration::from_millis(10);
const SPIN_MAX: Duration = Duration::from_micros(2500);
/// The timer thread is real-time while it uses less than RT_MAX of each RT_WINDOW of CPU
/// (spinning included): 5%. Measured per 200 ms: the light replay's timer threads (320
/// connections at 20/s) 1.2-1.4% at the median and 2.9% at most; at 1,000 connections on
/// 2 cores 5-14% while the connections arrive.
const RT_WINDOW: Duration = Duration::from_millis(200);
const RT_MAX: Duration = Duration::from_millis(10);
/// SCHED_FIFO priority within that budget: the lowest (the datapath runs at 10).
const RT_PRIORITY: i32 = 1;

/// Whether the timer thread was granted real-time priority: 0 not started, 1 yes, 2 no.
static REALTIME: AtomicU8 = AtomicU8::new(0);

/// A job for the timer thread: runs at its deadline with the instant it started.
type Job = Box<dyn FnOnce(Instant) + Send>;

struct Entry {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

pub struct HrTimer {
    tx: Sender<(Instant, Job)>,
}

impl HrTimer {
    /// The process-wide timer thread (started on first use).
    pub fn global() -> &'static HrTimer {
        static T: OnceLock<HrTimer> = OnceLock::new();
        T.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(Instant, Job)>();
            std::thread::Builder::new()
                .name("mimic-hrtimer".into())
                .spawn(move || {
                    set_timer_slack();
                    run(rx)
                })
                .expect("spawn timer thread");
            HrTimer { tx }
        })
    }

    /// Whether the timer thread runs real-time within its budget (None before it has started;
    /// false when the system refused, e.g. without root or CAP_SYS_NICE: then a deadline can
    /// be kept up to a scheduler tick late).
    pub fn realtime() -> Option<bool> {
        match REALTIME.load(Ordering::Relaxed) {
            0 => None,
            v => Some(v == 1),
        }
    }

    /// Keeps the timer thread on `cpus` from now on (in the lab: off the network emulator's
    /// datapath CPU). Not to be called from a timer job.
    pub fn pin(&self, cpus: &[usize]) -> std::io::Result<()> {
        let cpus = cpus.to_vec();
        self.on_thread(move || mimic_core::cpu::pin_current_thread(&cpus))?
    }

    /// Runs `f` on the timer thread now and waits for its result (blocking the caller: not
    /// for async tasks or timer jobs).
    fn on_thread<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::io::Result<R> {
        let gone = || std::io::Error::other("the timer thread has stopped");
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |_| {
            let _ = tx.send(f());
        });
        self.tx.send((Instant::now(), job)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())
    }

    /// Runs `job` on the timer thread at `deadline` (at once if it has passed) and resolves
    /// with its result and the instant it started. The job must not block: it runs between
    /// other deadlines. If the waiting task is dropped first, the job is dropped unrun.
    pub async fn run_at<T, F>(&self, deadline: Instant, job: F) -> (T, Instant)
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let boxed: Job = Box::new(move |started| {
            if !tx.is_closed() {
                let r = job();
                let _ = tx.send((r, started));
            }
        });
        if deadline <= Instant::now() {
            boxed(Instant::now());
        } else if let Err(mpsc::SendError((_, boxed))) = self.tx.send((deadline, boxed)) {
            // the timer thread is gone (process exiting): fall back to tokio's timer
            tokio::time::sleep_until(deadline.into()).await;
            boxed(Instant::now());
        }
        match rx.await {
            Ok(v) => v,
            // the job panicked on the timer thread; nothing to hand back
            Err(_) => panic!("timer job did not complete"),
        }
    }

    /// Sends `bytes` on `sock` at `deadline`: the timer thread hands the kernel as much as the
    /// socket takes without blocking. Returns the stream and the bytes back, how many were
    /// sent (the caller writes the rest), and the instant the send was made.
    pub async fn send_at<B>(
        &self,
        sock: tokio::net::TcpStream,
        bytes: B,
        deadline: Instant,
    ) -> (tokio::net::TcpStream, B, std::io::Result<usize>, Instant)
    where
        B: AsRef<[u8]> + Send + 'static,
    {
        use std::os::fd::AsRawFd;
        let ((sock, bytes, r), sent_at) = self
            .run_at(deadline, move || {
                let r = send_now(sock.as_raw_fd(), bytes.as_ref());
                (sock, bytes, r)
            })
            .await;
        (sock, bytes, r, sent_at)
    }

    /// Resolves at `deadline` (or at once if it has passed) with the time the timer fired.
    pub async fn sleep_until(&self, deadline: Instant) -> Instant {
        if deadline <= Instant::now() {
            return Instant::now();
        }
        self.run_at(deadline, || ()).await.1
    }

    pub async fn sleep(&self, d: Duration) -> Instant {
        self.sleep_until(Instant::now() + d).await
    }
}

/// The timer thread's scheduling: real-time within its [`RtBudget`] if the system grants it.
struct Sched {
    budget: RtBudget,
    granted: bool,
    rt: bool,
}

impl Sched {
    fn start() -> Sched {
        let granted = match cpu::set_realtime(Some(RT_PRIORITY)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "the timer thread runs without real-time priority ({e}): a deadline can be \
                     kept up to a scheduler tick late on a busy CPU"
                );
                false
            }
        };
        REALTIME.store(if granted { 1 } else { 2 }, Ordering::Relaxed);
        Sched {
            budget: RtBudget::new(RT_WINDOW.as_nanos() as u64, RT_MAX.as_nanos() as u64),
            granted,
            rt: granted,
        }
    }

    /// Before sleeping from `now_ns` until `wake_ns` (or a new entry): the policy changes only
    /// here, where the thread is about to block anyway (a thread that lowers its own priority
    /// while it runs is rescheduled at once, and the jobs still due would wait behind others).
    fn sleeping(&mut self, now_ns: u64, wake_ns: u64) {
        if !self.granted {
            return;
        }
        let rt = self.budget.may_wake(now_ns, wake_ns, cpu::thread_cpu_ns());
        if rt != self.rt && cpu::set_realtime(rt.then_some(RT_PRIORITY)).is_ok() {
            self.rt = rt;
            if !rt {
                // leaving SCHED_FIFO gives the thread the default 50 µs timer slack back
                // (Linux 6.7 on): at 1,000 connections, with a budget that switched often,
                // the median lateness was 82 µs with it and 55 µs with 1 ns set again
                set_timer_slack();
            }
        }
    }
}

/// 1 ns of timer slack for the calling thread: it wakes when asked, not up to 50 µs later.
fn set_timer_slack() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
    }
}

fn run(rx: mpsc::Receiver<(Instant, Job)>) {
    let mut heap: BinaryHeap<Reverse<Entry>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut add = |heap: &mut BinaryHeap<Reverse<Entry>>, (at, job): (Instant, Job)| {
        seq += 1;
        heap.push(Reverse(Entry { at, seq, job }));
    };
    let origin = Instant::now();
    let ns = |t: Instant| t.saturating_duration_since(origin).as_nanos() as u64;
    let mut sched = Sched::start();
    let mut budget = SpinBudget::new(SPIN_WINDOW.as_nanos() as u64, SPIN_MAX.as_nanos() as u64);
    let mut load = MachineLoad::new();
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|e| e.0.at <= now) {
            let e = heap.pop().expect("peeked").0;
            (e.job)(Instant::now());
        }
        let t = ns(now);
        if let Some(h) = load.headroom(t, budget.spun_total()) {
            budget.set_headroom(h);
        }
        budget.roll(t);
        match heap.peek().map(|e| e.0.at) {
            None => {
                sched.sleeping(t, u64::MAX);
                match rx.recv() {
                    Ok(v) => add(&mut heap, v),
                    Err(_) => return,
                }
            }
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                let spin = if budget.may_spin() {
                    SPIN
                } else {
                    Duration::ZERO
                };
                if left > spin {
                    sched.sleeping(t, ns(at - spin));
                    match rx.recv_timeout(left - spin) {
                        Ok(v) => add(&mut heap, v),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    // spin until the deadline, still taking new entries
                    let from = Instant::now();
                    loop {
                        match rx.try_recv() {
                            Ok(v) => add(&mut heap, v),
                            Err(TryRecvError::Empty) => {}
                            Err(TryRecvError::Disconnected) => return,
                        }
                        if Instant::now() >= at {
                            break;
                        }
                        std::hint::spin_loop();
                    }
                    budget.add_spin(from.elapsed().as_nanos() as u64);
                }
            }
        }
    }
}

/// Sends as much of `bytes` as the socket takes without blocking; for timer jobs. Returns the
/// count sent (0 when the send buffer is full) or the error.
fn send_now(fd: std::os::fd::RawFd, bytes: &[u8]) -> std::io::Result<usize> {
    // SAFETY: send(2) reads `bytes.len()` bytes from a live slice; the caller keeps `fd` open.
    let r = unsafe {
        libc::send(
            fd,
            bytes.as_ptr() as *const libc::c_void,
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r >= 0 {
        return Ok(r as usize);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(0)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    /// Polls `f` once, with a waker that does nothing: what it does before its first await.
    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_in_order_and_not_early() {
        let t = HrTimer::global();
        let start = Instant::now();
        let mut handles = Vec::new();
        for k in (1..=20u64).rev() {
            handles.push(tokio::spawn(async move {
                let at = start + Duration::from_micros(500 * k);
                let woke = t.sleep_until(at).await;
                (at, woke)
            }));
        }
        for h in handles {
            let (at, woke) = h.await.unwrap();
            // never early (a late wake on a busy machine is measured by the server's stats)
            assert!(woke >= at, "woke {:?} early", at - woke);
        }
        // a deadline in the past returns at once: ready on the first poll, without a trip
        // through the timer thread (a wall-clock bound would be a timed assertion that a
        // loaded machine breaks)
        let before = Instant::now();
        match poll_once(std::pin::pin!(
            t.sleep_until(before - Duration::from_millis(1))
        )) {
            Poll::Ready(woke) => assert!(woke >= before),
            Poll::Pending => panic!("a past deadline waited"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_run_on_the_timer_thread_at_their_deadline() {
        let t = HrTimer::global();
        let at = Instant::now() + Duration::from_millis(3);
        let (name, started) = t
            .run_at(at, || std::thread::current().name().map(str::to_owned))
            .await;
        assert_eq!(name.as_deref(), Some("mimic-hrtimer"));
        assert!(started >= at, "started {:?} early", at - started);
        // a job whose waiter is gone is dropped unrun
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let at = Instant::now() + Duration::from_millis(20);
        // poll it once, so the job is queued, then drop it at once, at the block's end (a
        // timeout to drop it can fire after the deadline on a loaded machine: the job then runs)
        {
            let fut = std::pin::pin!(t.run_at(at, move || {
                r.store(true, std::sync::atomic::Ordering::SeqCst)
            }));
            assert!(poll_once(fut).is_pending());
        }
        t.sleep_until(at + Duration::from_millis(3)).await;
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        // a deadline in the past runs the job at once, on the caller's thread
        let (v, _) = t
            .run_at(Instant::now() - Duration::from_millis(1), || 7)
            .await;
        assert_eq!(v, 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pin_moves_the_timer_thread_and_it_keeps_working() {
        let t = HrTimer::global();
        let allowed = mimic_core::cpu::allowed_cpus().unwrap();
        let one = *allowed.last().unwrap();
        let cpus_of_timer = || {
            t.on_thread(|| mimic_core::cpu::allowed_cpus().unwrap())
                .unwrap()
        };
        t.pin(&[one]).unwrap();
        assert_eq!(cpus_of_timer(), vec![one]);
        t.pin(&allowed).unwrap();
        assert_eq!(cpus_of_timer(), allowed);
        assert!(t.pin(&[]).is_err());
        let at = Instant::now() + Duration::from_millis(2);
        assert!(t.sleep_until(at).await >= at);
    }

    #[test]
    fn send_now_sends_what_fits_and_reports_a_full_buffer_as_zero() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        assert_eq!(send_now(c.as_raw_fd(), b"hello").unwrap(), 5);
        // the peer never reads: the buffers fill and a send takes nothing
        let big = vec![0u8; 1 << 20];
        let mut zero = false;
        for _ in 0..256 {
            if send_now(c.as_raw_fd(), &big).unwrap() == 0 {
                zero = true;
                break;
            }
        }
        assert!(zero, "the send buffer never filled");
    }
}
