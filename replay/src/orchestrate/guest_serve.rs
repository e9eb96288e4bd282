//! The server emulator in a lab whose server host is a QEMU guest (`mimic lab up
//! --server-kernel IMAGE`): `mimic serve` is started inside the guest through its command
//! channel (the same binary, which the guest reads from the host's files over 9p) and its
//! control channel is TCP on the guest's management link (`ns_srv` 198.18.255.1 ↔ guest
//! 198.18.255.2), with the lab's PKI. The guest cannot see the host's unix sockets; the
//! management link keeps the control traffic off the data path (it never crosses the network
//! emulator), and the socket is opened from `ns_srv`, where that link is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mimic_netemu::control::ControlAddr;
use mimic_netemu::guest::{self, GuestRecord};
use mimic_netemu::netns;

use super::ReplayError;
use crate::control::{ControlError, ControllerTls, ServeClient};

/// Where the guest's `mimic serve` writes its log (the guest's own tmpfs); copied to the
/// replay's work dir when it stops or fails.
const GUEST_LOG: &str = "/run/mimic-serve.log";
/// The pid of the guest's `mimic serve`, so that the next replay can end one left behind.
const GUEST_PID: &str = "/run/mimic-serve.pid";

/// A `mimic serve` running in the server guest: stopped (TERM, then KILL) and its log copied
/// out when dropped.
pub(super) struct GuestServe {
    rec: GuestRecord,
    pid: i32,
    log: PathBuf,
    stopped: bool,
}

fn guest_err(e: guest::GuestError) -> ReplayError {
    ReplayError::Role {
        role: "server emulator",
        why: e.to_string(),
    }
}

impl GuestServe {
    /// Starts `exe ARGS` in the guest in the background (stdin /dev/null, output to its log
    /// there) and returns at once; `log` is the host file the log is copied to.
    pub fn start(
        rec: &GuestRecord,
        exe: &Path,
        args: Vec<OsString>,
        log: &Path,
    ) -> Result<GuestServe, ReplayError> {
        let mut argv: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            // a serve left behind by a replay that was killed (SIGKILL: no Drop) would hold
            // the ports: the one recorded is killed first
            format!(
                "p=$(cat {GUEST_PID} 2>/dev/null); [ -n \"$p\" ] && grep -qs serve /proc/$p/cmdline \
                 && {{ kill -KILL $p; sleep 0.3; }}; \
                 log=$1; shift; \"$@\" </dev/null >\"$log\" 2>&1 & echo $! > {GUEST_PID}; echo $!"
            ),
            "sh".into(),
            GUEST_LOG.into(),
            exe.to_string_lossy().into_owned(),
        ];
        argv.extend(args.iter().map(|a| a.to_string_lossy().into_owned()));
        let v: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = guest::exec_ok_within(rec, &v, Duration::from_secs(30)).map_err(guest_err)?;
        let pid: i32 = out.trim().parse().map_err(|_| ReplayError::Role {
            role: "server emulator",
            why: format!(
                "starting it in guest {} printed `{}`, not a pid",
                rec.netns,
                out.trim()
            ),
        })?;
        Ok(GuestServe {
            rec: rec.clone(),
            pid,
            log: log.to_path_buf(),
            stopped: false,
        })
    }

    /// Whether the process still runs in the guest (a zombie does not: the guest's PID 1
    /// adopts it and does not reap it).
    pub fn alive(&self) -> bool {
        let script = format!(
            "[ -e /proc/{0}/stat ] && [ \"$(cut -d' ' -f3 /proc/{0}/stat)\" != Z ]",
            self.pid
        );
        matches!(
            guest::exec(&self.rec, &["sh", "-c", &script], Some(Duration::from_secs(5))),
            Ok(r) if r.code() == 0
        )
    }

    /// Copies the guest's log to the host file (best effort).
    pub fn fetch_log(&self) {
        if let Ok(r) = guest::exec(
            &self.rec,
            &["cat", GUEST_LOG],
            Some(Duration::from_secs(10)),
        ) {
            let _ = std::fs::write(&self.log, r.stdout.as_bytes());
        }
    }

    /// TERM, KILL after `grace`, then the log is copied out.
    pub fn stop(&mut self, grace: Duration) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let tenths = (grace.as_millis() / 100).max(1);
        let script = format!(
            "kill -TERM {p} 2>/dev/null || exit 0\n\
             i=0; while [ $i -lt {tenths} ]; do\n\
               [ \"$(cut -d' ' -f3 /proc/{p}/stat 2>/dev/null)\" = Z ] && exit 0\n\
               [ -e /proc/{p} ] || exit 0\n\
               sleep 0.1; i=$((i+1))\n\
             done\n\
             kill -KILL {p} 2>/dev/null; exit 0",
            p = self.pid
        );
        let _ = guest::exec_ok_within(
            &self.rec,
            &["sh", "-c", &script],
            grace + Duration::from_secs(10),
        );
        self.fetch_log();
    }
}

impl Drop for GuestServe {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

/// Connects to the server emulator's control channel, the socket opened in namespace `ns`
/// (where the guest's management link is) when given.
pub(super) fn connect_serve(
    addr: &ControlAddr,
    tls: &ControllerTls,
    ns: Option<&str>,
) -> Result<ServeClient, ControlError> {
    let Some(ns) = ns else {
        return ServeClient::connect(addr, tls);
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            netns::enter(ns).map_err(|err| ControlError::Io {
                addr: addr.to_string(),
                err,
            })?;
            ServeClient::connect(addr, tls)
        })
        .join()
        .unwrap_or_else(|_| {
            Err(ControlError::Protocol(
                "the thread connecting to the server emulator panicked".into(),
            ))
        })
    })
}

/// How long the guest's server emulator may take to answer: a TCG guest reads the binary
/// over 9p and runs it emulated, seconds where a namespace takes milliseconds.
pub(super) const GUEST_READY: Duration = Duration::from_secs(90);

/// Rate-limits a costly liveness check (one command-channel round trip) to once per second.
pub(super) struct Every {
    last: Option<Instant>,
    was: bool,
}

impl Every {
    pub fn new() -> Every {
        Every {
            last: None,
            was: true,
        }
    }

    pub fn check(&mut self, f: impl FnOnce() -> bool) -> bool {
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last = Some(Instant::now());
            self.was = f();
        }
        self.was
    }
}
