//! Progress bars: shown only on a terminal and never with `--quiet`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

static QUIET: AtomicBool = AtomicBool::new(false);

pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// True when progress should be drawn (stderr is a terminal and not `--quiet`).
pub fn enabled() -> bool {
    !quiet() && std::io::stderr().is_terminal()
}

/// A byte-count bar (e.g. input read), hidden when progress is disabled.
pub fn bytes(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), target());
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>10} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// A count bar with a free-form message (e.g. connections done / failed / in flight).
pub fn count(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), target());
    pb.set_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:40}] {pos}/{len} {elapsed_precise} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// A spinner for a stage of unknown length.
pub fn spinner(what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(None, target());
    pb.set_style(
        ProgressStyle::with_template("{prefix:>10} {spinner} {elapsed_precise} {msg}")
            .expect("static template"),
    );
    pb.set_prefix(what.to_string());
    pb.enable_steady_tick(std::time::Duration::from_millis(200));
    pb
}

fn target() -> ProgressDrawTarget {
    if enabled() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// Runs `update` every `period` on its own thread until [`Ticker::stop`] (or drop), which
/// returns at once rather than after the thread's next wake-up.
pub struct Ticker {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    pub fn spawn(period: std::time::Duration, mut update: impl FnMut() + Send + 'static) -> Ticker {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || loop {
            update();
            match stopped.recv_timeout(period) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                _ => break,
            }
        });
        Ticker {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the updates; the last one has run when this returns.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.halt();
    }
}
