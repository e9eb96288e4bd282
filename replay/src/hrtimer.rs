//! Sub-millisecond sleeps for async tasks. Tokio's timer wheel has millisecond granularity
//! (and fires up to a tick late); the server emulator's response and query delays, and the
//! client's request times, are instead kept by one dedicated thread that sleeps with a 1 ns
//! timer slack until shortly before the earliest deadline, spins the rest, and wakes the
//! waiting task. Measured error: see the server's delay statistics.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender, TryRecvError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Time before a deadline spent spinning instead of sleeping.
const SPIN: Duration = Duration::from_micros(200);

struct Entry {
    at: Instant,
    seq: u64,
    tx: oneshot::Sender<Instant>,
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
    tx: Sender<(Instant, oneshot::Sender<Instant>)>,
}

impl HrTimer {
    /// The process-wide timer thread (started on first use).
    pub fn global() -> &'static HrTimer {
        static T: OnceLock<HrTimer> = OnceLock::new();
        T.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<(Instant, oneshot::Sender<Instant>)>();
            std::thread::Builder::new()
                .name("mimic-hrtimer".into())
                .spawn(move || {
                    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
                    unsafe {
                        libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0);
                    }
                    run(rx)
                })
                .expect("spawn timer thread");
            HrTimer { tx }
        })
    }

    /// Resolves at `deadline` (or at once if it has passed) with the time it woke.
    pub async fn sleep_until(&self, deadline: Instant) -> Instant {
        if deadline <= Instant::now() {
            return Instant::now();
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send((deadline, tx)).is_err() {
            // the timer thread is gone (process exiting): fall back to tokio's timer
            tokio::time::sleep_until(deadline.into()).await;
            return Instant::now();
        }
        rx.await.unwrap_or_else(|_| Instant::now())
    }

    pub async fn sleep(&self, d: Duration) -> Instant {
        self.sleep_until(Instant::now() + d).await
    }
}

fn run(rx: mpsc::Receiver<(Instant, oneshot::Sender<Instant>)>) {
    let mut heap: BinaryHeap<Reverse<Entry>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut add = |heap: &mut BinaryHeap<Reverse<Entry>>,
                   (at, tx): (Instant, oneshot::Sender<Instant>)| {
        seq += 1;
        heap.push(Reverse(Entry { at, seq, tx }));
    };
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|e| e.0.at <= now) {
            let e = heap.pop().expect("peeked").0;
            let _ = e.tx.send(now);
        }
        match heap.peek().map(|e| e.0.at) {
            None => match rx.recv() {
                Ok(v) => add(&mut heap, v),
                Err(_) => return,
            },
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left > SPIN {
                    match rx.recv_timeout(left - SPIN) {
                        Ok(v) => add(&mut heap, v),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    // spin until the deadline, still taking new entries
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
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // a deadline in the past returns at once
        let before = Instant::now();
        t.sleep_until(before - Duration::from_millis(1)).await;
        assert!(before.elapsed() < Duration::from_millis(5));
    }
}
