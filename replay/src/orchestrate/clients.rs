//! The replay itself: the client emulator runs every planned connection (in the lab's client
//! namespace), each on its own task, at its planned time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mimic_core::cpu;
use mimic_netemu::netns;

use super::kernel::PipeGate;
use super::{Progress, ReplayError};
use crate::client::{self, Outcome, Planned};
use crate::hrtimer::HrTimer;

/// What per-connection kernel pipes need from the clients: `done` hears each connection's
/// index as it ends (its pipes are removed then), and `gate` holds each connection's SYN
/// until its pipes are in.
pub struct PipeHooks {
    pub done: Sender<usize>,
    pub gate: Arc<PipeGate>,
}

/// How often a SYN held for its pipes looks at its gate again besides being woken when an
/// install batch opens gates.
const GATE_POLL: Duration = Duration::from_millis(50);

/// Runs every planned connection (in the client namespace when given) and returns the
/// outcomes in plan order. A client agent runs its share through it too. With `pipes`
/// (per-connection kernel pipes) no SYN leaves before its pipes are in.
pub fn run_clients(
    plans: Vec<Planned>,
    ns: Option<String>,
    timer_cpus: Option<Vec<usize>>,
    pipes: Option<PipeHooks>,
    progress: &Progress,
    stop: &AtomicBool,
) -> Result<Vec<Outcome>, ReplayError> {
    let n = plans.len();
    let stop_flag = Arc::new(AtomicBool::new(false));
    let counters = Arc::new([
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ]);
    let handle = {
        let stop_flag = stop_flag.clone();
        let counters = counters.clone();
        std::thread::Builder::new()
            .name("mimic-clients".into())
            .spawn(move || -> Result<Vec<Outcome>, ReplayError> {
                if let Some(ns) = &ns {
                    // threads started from here (the runtime's workers) inherit the namespace
                    netns::enter(ns).map_err(|e| ReplayError::Io(e.to_string()))?;
                }
                raise_fd_limit();
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| ReplayError::Io(format!("client runtime: {e}")))?;
                rt.block_on(async move {
                    let timer = HrTimer::global();
                    if let Some(c) = &timer_cpus {
                        if let Err(e) = timer.pin(c) {
                            tracing::warn!(
                                "keeping the client timer thread on CPUs {}: {e}",
                                cpu::format_list(c)
                            );
                        }
                    }
                    let mut set = tokio::task::JoinSet::new();
                    let (done, gate) = match pipes {
                        Some(h) => (Some(h.done), Some(h.gate)),
                        None => (None, None),
                    };
                    for p in plans {
                        let counters = counters.clone();
                        let done = done.clone();
                        let gate = gate.clone();
                        set.spawn(async move {
                            tokio::time::sleep_until((p.start - Duration::from_millis(5)).into())
                                .await;
                            if let Some(g) = gate.filter(|g| !g.is_open(p.index)) {
                                // its pipes are not in yet: the SYN waits (and starts late)
                                g.wait(p.index, GATE_POLL).await;
                                let late = Instant::now().saturating_duration_since(p.start);
                                if !late.is_zero() {
                                    g.held(late);
                                }
                            }
                            let now = counters[2].fetch_add(1, Ordering::Relaxed) + 1;
                            counters[3].fetch_max(now, Ordering::Relaxed);
                            let o = client::run(p, timer).await;
                            counters[2].fetch_sub(1, Ordering::Relaxed);
                            counters[if o.result.is_ok() { 0 } else { 1 }]
                                .fetch_add(1, Ordering::Relaxed);
                            if let Some(d) = &done {
                                let _ = d.send(o.index);
                            }
                            o
                        });
                    }
                    let mut outcomes: Vec<Outcome> = Vec::with_capacity(n);
                    loop {
                        tokio::select! {
                            r = set.join_next() => match r {
                                Some(Ok(o)) => outcomes.push(o),
                                // tasks aborted by Ctrl-C are expected, not worth a warning
                                Some(Err(e)) if e.is_cancelled() => {}
                                Some(Err(e)) => tracing::warn!("client task: {e}"),
                                None => break,
                            },
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                                if stop_flag.load(Ordering::Relaxed) {
                                    set.abort_all();
                                }
                            }
                        }
                    }
                    drop(done);
                    outcomes.sort_by_key(|o| o.index);
                    Ok(outcomes)
                })
            })
            .map_err(|e| ReplayError::Io(e.to_string()))?
    };
    let publish = || {
        let c = |k: usize| counters[k].load(Ordering::Relaxed);
        progress.done.store(c(0), Ordering::Relaxed);
        progress.failed.store(c(1), Ordering::Relaxed);
        progress.in_flight.store(c(2), Ordering::Relaxed);
        progress.max_in_flight.store(c(3), Ordering::Relaxed);
    };
    while !handle.is_finished() {
        publish();
        if stop.load(Ordering::Relaxed) {
            stop_flag.store(true, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    publish();
    handle
        .join()
        .map_err(|_| ReplayError::Io("client thread panicked".into()))?
}

fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}
