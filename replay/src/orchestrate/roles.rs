//! The other roles of a replay: in the lab, the network emulator, the server emulator and the
//! capture of the server side, each started as a process from its crate's spec
//! ([`EmulatorSpec`], [`ServeSpec`], [`CaptureSpec`]) in its namespace; remote, the emulators
//! being already up, the capture at the server host by `mimic serve` over its control channel
//! (`--vantage server`, [`crate::serve_capture`]) or on a local interface (`--vantage
//! client`). Then waiting until each is ready, and at the end stopping them and reading what
//! the capture reports (remote at the server: its files brought over and checked).

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use mimic_capture::source::SourceSpec;
#[cfg(test)]
use mimic_capture::PayloadPolicy;
use mimic_capture::{CaptureSpec, CaptureSummary};
use mimic_core::cpu;
use mimic_netemu::control::{Client as NetemuClient, ControlAddr, ControlError};
use mimic_netemu::datapath::SpinRule;
use mimic_netemu::lab::{self, LabInfo, LabOptions};
use mimic_netemu::netns;
use mimic_netemu::spec::{Bridge, EmulatorSpec};
use mimic_netemu::stack::{self, StackProfile};

use super::error::last_try;
use super::guest_emu::GuestEmulator;
use super::guest_serve::{self, GuestServe};
use super::kernel::KernelPipes;
use super::{interrupted, CpuSplit, Progress, ReplayError};
use crate::control::{ControllerTls, ServeClient};
use crate::serve_capture::{replay_capture as capture_spec, CaptureFetch};
use crate::spec::{Emulator, RemoteCapture, ReplayOptions, ServeSpec, Target};

const NETEMU: &str = "network emulator";
const SERVE: &str = "server emulator";
const CAPTURE: &str = "capture";

/// Where the roles of a running replay are and what they were given.
pub(super) struct Endpoints {
    /// The server emulator's data address.
    pub server: SocketAddr,
    pub netemu: ControlAddr,
    /// The namespace the emulator's control address is reached from (None: this one).
    pub netemu_ns: Option<String>,
    pub serve: ControlAddr,
    /// The namespace the control socket to the server emulator is opened in (a server guest's
    /// management link is in `ns_srv`); None: this process's own.
    pub serve_ns: Option<String>,
    /// The controller's side of the control channels.
    pub tls: ControllerTls,
    /// Source addresses of the replayed connections.
    pub client_addrs: Vec<Ipv4Addr>,
    /// The namespace the client emulator runs in (the lab's client host).
    pub client_ns: Option<String>,
    pub lab: Option<String>,
    /// The server's stack as read back after it was set.
    pub stack_in_force: Option<StackProfile>,
    pub cpu_split: Option<CpuSplit>,
    /// Where the replay is captured: `server` (the lab: the server's namespace, as an
    /// original from a tap is; remote: by `mimic serve` on its host) or `client` (remote,
    /// `--vantage client`: `--capture-iface` on this host).
    pub capture_vantage: &'static str,
    /// The interface captured on (remote at the server: as serve reports it once started).
    pub capture_iface: String,
}

/// Where the replay's capture runs.
enum Capture {
    /// A capture process this replay started (the lab's server namespace, or this host).
    Process(Box<CaptureSpec>),
    /// `mimic serve`'s capture at the server host; its files are fetched into `dir`.
    Serve { dir: PathBuf },
}

/// The started roles: processes stopped (TERM, then KILL) and a lab the replay built torn
/// down when dropped, in that order.
pub(super) struct Roles {
    processes: Processes,
    /// The server emulator when it runs in the lab's server guest.
    guest_serve: Option<GuestServe>,
    /// `--emulator netem|dummynet`: the kernel pipes on the router host (removed before the
    /// lab goes).
    pub kernel: Option<KernelPipes>,
    /// mimic's emulator in a router guest (stopped, the guest's bridge restored, before the
    /// lab goes).
    guest_emu: Option<GuestEmulator>,
    _lab: LabGuard,
    capture: Capture,
    work: PathBuf,
    pub endpoints: Endpoints,
    /// What bringing the server host's capture here cost (None: not captured there).
    pub fetched: Option<CaptureFetch>,
}

/// The control channels of the two emulators, once they answer.
pub(super) struct Controls {
    /// None: kernel pipes (`--emulator netem|dummynet`) in the lab, no emulator process.
    pub netemu: Option<NetemuClient>,
    pub serve: ServeClient,
    /// serve captures this replay and has not handed the capture over yet: discarded there
    /// if the replay ends early.
    serve_capturing: bool,
}

impl Drop for Controls {
    fn drop(&mut self) {
        if self.serve_capturing {
            if let Err(e) = self.serve.capture_discard() {
                tracing::warn!("the server emulator's capture was not discarded: {e}");
            }
        }
    }
}

/// `-q` and the role's own arguments.
fn quiet(args: Vec<OsString>) -> Vec<OsString> {
    std::iter::once(OsString::from("-q")).chain(args).collect()
}

impl Roles {
    /// Brings up the lab when needed and starts (lab) or finds (remote) the roles; their logs
    /// go to `work`, the capture files to `capdir`.
    pub fn start(
        opts: &ReplayOptions,
        work: &Path,
        capdir: &Path,
        progress: &Progress,
    ) -> Result<Roles, ReplayError> {
        // declared in this order so that on an error the processes stop before the lab goes
        let mut lab_guard = LabGuard(None);
        let mut processes = Processes::default();
        let mut guest_serve = None;
        let mut kernel = None;
        let mut guest_emu = None;
        let exe = opts.exe.as_os_str();
        let (endpoints, capture) = match &opts.target {
            Target::Lab { name, keep } => {
                let info = LabInfo::for_name(name)?;
                if !netns::exists(&info.ns_cli) {
                    let (_, notes) = lab::up(
                        name,
                        &LabOptions {
                            stack: opts.stack.clone(),
                            // a lab this replay takes down at its end is swept if the
                            // replay is killed first; a kept one stays
                            owner: (!keep).then(lab::Owner::current),
                        },
                    )?;
                    for n in notes {
                        tracing::info!("{n}");
                    }
                    if !keep {
                        lab_guard.0 = Some(name.clone());
                    }
                } else if let Some(p) = &opts.stack {
                    for n in stack::apply(name, p)? {
                        tracing::info!("{n}");
                    }
                }
                let stack_in_force = stack::read_back(name).ok();
                if opts.emulator != Emulator::Mimic {
                    kernel = Some(KernelPipes::prepare(opts.emulator, &info)?);
                }
                let tls = info.controller_tls()?;
                // a server host on a kernel of its own (`lab up --server-kernel`): serve runs
                // in the guest, its control channel on the guest's management link
                let srv_guest = match lab::host(name, "srv")? {
                    lab::Host::Guest(r) => Some(*r),
                    lab::Host::Namespace(_) => None,
                };
                let serve_ctl: ControlAddr = match &srv_guest {
                    Some(_) => info.server_guest_control(),
                    None => format!("unix:{}", info.runtime_dir.join("serve.sock").display()),
                }
                .parse()
                .map_err(ReplayError::Invalid)?;
                let mut netemu_ctl: ControlAddr =
                    info.control.parse().map_err(ReplayError::Invalid)?;
                let server = SocketAddr::new(IpAddr::V4(info.server_addr), opts.server_port);
                progress.stage("roles");
                // the real-time datapath gets a CPU of its own, the timer threads the others
                let cpu_split = opts
                    .cpu_split
                    .then(cpu::allowed_cpus)
                    .and_then(Result::ok)
                    .and_then(|a| cpu::lab_split(&a))
                    .map(|(datapath, timers)| CpuSplit { datapath, timers });
                let mut emu = EmulatorSpec::new(Bridge::Lab(name.clone()));
                emu.control = Some(netemu_ctl.clone());
                emu.pki = Some(info.pki_dir.clone());
                emu.cpu = cpu_split.as_ref().map(|c| c.datapath);
                // the datapath shares the machine with the clients and servers: its busy-wait
                // gives way to them as the machine gets busy (netemu::datapath::SpinRule)
                emu.spin_rule = SpinRule::BESIDE_HOSTS;
                let mut serve = ServeSpec::new(server);
                serve.control = Some(serve_ctl.clone());
                serve.pki = Some(info.pki_dir.clone());
                // the host's CPU numbers mean nothing in a guest
                serve.timer_cpus = cpu_split
                    .as_ref()
                    .filter(|_| srv_guest.is_none())
                    .map(|c| c.timers.clone());
                let capture = capture_spec(SourceSpec::Iface(info.srv_if.clone()), capdir);
                let router_guest = mimic_netemu::guest::load_record(&info.runtime_dir, "emu");
                let mut netemu_ns = None;
                match (&kernel, router_guest) {
                    (Some(_), _) => {}
                    (None, Some(rec)) => {
                        let (g, addr) = GuestEmulator::start(rec, &info, &opts.exe)?;
                        guest_emu = Some(g);
                        netemu_ctl = addr;
                        // the guest's control address is on the lab's /24
                        netemu_ns = Some(info.ns_cli.clone());
                    }
                    (None, None) => processes.spawn(
                        NETEMU,
                        netns::command(&info.ns_emu, exe, quiet(emu.to_args())),
                        &work.join("netemu.log"),
                    )?,
                }
                match &srv_guest {
                    Some(rec) => {
                        guest_serve = Some(GuestServe::start(
                            rec,
                            &opts.exe,
                            quiet(serve.to_args()),
                            &work.join("serve.log"),
                        )?);
                    }
                    None => processes.spawn(
                        SERVE,
                        netns::command(&info.ns_srv, exe, quiet(serve.to_args())),
                        &work.join("serve.log"),
                    )?,
                }
                processes.spawn(
                    CAPTURE,
                    netns::command(&info.ns_srv, exe, quiet(capture.to_args())),
                    &work.join("capture.log"),
                )?;
                let pool: Vec<Ipv4Addr> = (0..info.pool_len())
                    .filter_map(|i| info.pool_addr(i))
                    .collect();
                let endpoints = Endpoints {
                    server,
                    netemu: netemu_ctl,
                    netemu_ns,
                    serve: serve_ctl,
                    serve_ns: srv_guest.as_ref().map(|_| info.ns_srv.clone()),
                    tls,
                    client_addrs: pool,
                    client_ns: Some(info.ns_cli.clone()),
                    lab: Some(name.clone()),
                    stack_in_force,
                    cpu_split,
                    capture_vantage: "server",
                    capture_iface: info.srv_if.clone(),
                };
                (endpoints, Capture::Process(Box::new(capture)))
            }
            Target::Remote {
                server,
                server_control,
                netemu,
                pki_dir,
                capture,
                client_addrs,
            } => {
                let tls = ControllerTls::load(pki_dir).map_err(ControlError::from)?;
                if client_addrs.is_empty() {
                    return Err(ReplayError::Invalid(
                        "a remote replay needs at least one --client-addr".into(),
                    ));
                }
                let (cap, iface) = match capture {
                    RemoteCapture::Client { iface } => {
                        let spec = capture_spec(SourceSpec::Iface(iface.clone()), capdir);
                        let mut c = Command::new(exe);
                        c.args(quiet(spec.to_args()));
                        processes.spawn(CAPTURE, c, &work.join("capture.log"))?;
                        (Capture::Process(Box::new(spec)), iface.clone())
                    }
                    // started over serve's control channel once it answers
                    RemoteCapture::Server => (
                        Capture::Serve {
                            dir: capdir.to_path_buf(),
                        },
                        String::new(),
                    ),
                };
                if opts.emulator != Emulator::Mimic {
                    kernel = Some(KernelPipes::prepare_remote(opts.emulator, netemu, &tls)?);
                }
                let endpoints = Endpoints {
                    server: *server,
                    netemu: netemu.clone(),
                    netemu_ns: None,
                    serve: server_control.clone(),
                    serve_ns: None,
                    tls,
                    client_addrs: client_addrs.clone(),
                    client_ns: None,
                    lab: None,
                    stack_in_force: None,
                    cpu_split: None,
                    capture_vantage: capture.vantage(),
                    capture_iface: iface,
                };
                (endpoints, cap)
            }
        };
        Ok(Roles {
            processes,
            guest_serve,
            kernel,
            guest_emu,
            _lab: lab_guard,
            capture,
            work: work.to_path_buf(),
            endpoints,
            fetched: None,
        })
    }

    /// Waits until both emulators answer on their control channels and the capture is
    /// capturing (at the server host: started over serve's control channel). A refused
    /// handshake (a certificate not from this PKI) ends the wait at once; an absent listener
    /// is retried; a role that exits ends it with the tail of its log.
    pub fn connect(&mut self, remote: bool, stop: &AtomicBool) -> Result<Controls, ReplayError> {
        let (ep, processes) = (&self.endpoints, &mut self.processes);
        let guest_emu = &self.guest_emu;
        let netemu = match &self.kernel {
            Some(_) => None,
            None => Some(
                wait_for(
                    NETEMU,
                    Duration::from_secs(if guest_emu.is_some() { 60 } else { 15 }),
                    stop,
                    || match guest_emu {
                        Some(g) => g.alive(),
                        None => processes.alive(NETEMU) || remote,
                    },
                    || attempt(connect_netemu(ep)),
                )
                .map_err(|e| match guest_emu {
                    Some(g) => match e.role_failure() {
                        Some((role, why)) => ReplayError::Role {
                            role,
                            why: format!("{why}; log in the router guest: {}", g.log_tail()),
                        },
                        None => e,
                    },
                    None => annotate(
                        e,
                        &self.work.join("netemu.log"),
                        remote.then_some(&ep.netemu),
                    ),
                })?,
            ),
        };
        let in_guest = self.guest_serve.as_ref();
        let mut every = guest_serve::Every::new();
        let serve = wait_for(
            SERVE,
            match in_guest {
                Some(_) => guest_serve::GUEST_READY,
                None => Duration::from_secs(15),
            },
            stop,
            || match in_guest {
                Some(g) => every.check(|| g.alive()),
                None => processes.alive(SERVE) || remote,
            },
            || {
                attempt(guest_serve::connect_serve(
                    &ep.serve,
                    &ep.tls,
                    ep.serve_ns.as_deref(),
                ))
            },
        )
        .map_err(|e| {
            if let Some(g) = in_guest {
                g.fetch_log();
            }
            annotate(
                e,
                &self.work.join("serve.log"),
                (remote && in_guest.is_none()).then_some(&ep.serve),
            )
        })?;
        let mut ctl = Controls {
            netemu,
            serve,
            serve_capturing: false,
        };
        match &self.capture {
            Capture::Process(capture) => {
                wait_for(
                    CAPTURE,
                    Duration::from_secs(15),
                    stop,
                    || processes.alive(CAPTURE),
                    || Ok(capture.ready().map(|_| ()).ok_or_else(String::new)),
                )
                .map_err(|e| annotate(e, &self.work.join("capture.log"), None))?;
            }
            Capture::Serve { .. } => {
                // (a discard goes out with the controls from here on, whatever happens)
                ctl.serve_capturing = true;
                let started = ctl.serve.capture_start().map_err(|e| ReplayError::Role {
                    role: CAPTURE,
                    why: format!(
                        "the server emulator could not capture at its host: {e} (or capture on this host: --vantage client --capture-iface IF)"
                    ),
                })?;
                tracing::info!(
                    "the server emulator captures on {} ({})",
                    started.source,
                    started.filter.as_deref().unwrap_or("no filter")
                );
                self.endpoints.capture_iface = started.iface;
            }
        }
        Ok(ctl)
    }

    /// Ends the roles: a capture at the server host is stopped and its files brought here
    /// (checked by size and SHA-256); in the lab both emulators are shut down over their
    /// control channels (remote ones keep serving); a capture process is stopped and its
    /// summary read; then the emulator processes are stopped. The summary is None when a
    /// capture process wrote none; a capture at the server that cannot be brought over is
    /// an error.
    pub fn stop(
        &mut self,
        mut ctl: Controls,
        lab: bool,
    ) -> Result<Option<CaptureSummary>, ReplayError> {
        let mut summary = None;
        if let Capture::Serve { dir } = &self.capture {
            let t = Instant::now();
            let (stopped, files) =
                ctl.serve
                    .capture_collect(dir)
                    .map_err(|e| ReplayError::Role {
                        role: CAPTURE,
                        why: format!("bringing the server host's capture here: {e}"),
                    })?;
            ctl.serve_capturing = false;
            let fetched = CaptureFetch {
                files: files.len(),
                bytes: stopped.files.iter().map(|f| f.bytes).sum(),
                seconds: t.elapsed().as_secs_f64(),
            };
            tracing::info!(
                "the server host's capture: {} files, {} bytes, brought over and checked in {:.2} s",
                fetched.files,
                fetched.bytes,
                fetched.seconds
            );
            self.fetched = Some(fetched);
            summary = Some(stopped.summary);
        }
        if lab {
            let _ = ctl.serve.shutdown();
            if let Some(n) = ctl.netemu.as_mut() {
                let _ = n.shutdown();
            }
        }
        if let Capture::Process(spec) = &self.capture {
            self.processes.stop(CAPTURE, Duration::from_secs(30));
            summary = match spec.read_summary() {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!("the replay's capture: {e}");
                    None
                }
            };
        }
        self.processes.stop(SERVE, Duration::from_secs(5));
        if let Some(g) = self.guest_serve.as_mut() {
            g.stop(Duration::from_secs(5));
        }
        self.processes.stop(NETEMU, Duration::from_secs(5));
        drop(self.guest_emu.take());
        Ok(summary)
    }

    /// The capture's closed pcapng files, in name order (which is time order).
    pub fn capture_files(&self) -> Result<Vec<PathBuf>, ReplayError> {
        let dir = match &self.capture {
            Capture::Process(spec) => &spec.dir,
            Capture::Serve { dir } => dir,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| ReplayError::Io(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pcapng"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(ReplayError::Role {
                role: CAPTURE,
                why: format!(
                    "no capture file ({})",
                    match self.capture {
                        Capture::Process(_) => log_tail(&self.work.join("capture.log")),
                        Capture::Serve { .. } => "the server host's capture had none".into(),
                    }
                ),
            });
        }
        Ok(files)
    }
}

/// Connects to the network emulator's control channel, from the namespace it is reached from
/// (a socket stays in the namespace it was made in, whichever thread uses it later).
fn connect_netemu(ep: &Endpoints) -> Result<NetemuClient, ControlError> {
    match &ep.netemu_ns {
        None => NetemuClient::connect(&ep.netemu, &ep.tls),
        Some(ns) => std::thread::scope(|s| {
            s.spawn(|| {
                netns::enter(ns).map_err(|err| ControlError::Io {
                    addr: format!("{} (from namespace {ns})", ep.netemu),
                    err,
                })?;
                NetemuClient::connect(&ep.netemu, &ep.tls)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(ControlError::Protocol(
                    "the thread connecting to the emulator panicked".into(),
                ))
            })
        }),
    }
}

/// Child processes that are stopped (TERM, then KILL) when dropped.
#[derive(Default)]
struct Processes {
    children: Vec<(&'static str, Child)>,
}

impl Processes {
    fn spawn(
        &mut self,
        role: &'static str,
        mut cmd: Command,
        log: &Path,
    ) -> Result<(), ReplayError> {
        let f = std::fs::File::create(log)
            .map_err(|e| ReplayError::Io(format!("{}: {e}", log.display())))?;
        let f2 = f.try_clone().map_err(|e| ReplayError::Io(e.to_string()))?;
        cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
        let child = cmd.spawn().map_err(|e| ReplayError::Role {
            role,
            why: e.to_string(),
        })?;
        self.children.push((role, child));
        Ok(())
    }

    fn alive(&mut self, role: &str) -> bool {
        self.children
            .iter_mut()
            .find(|(r, _)| *r == role)
            .is_some_and(|(_, c)| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends SIGTERM to `role` and waits for it (KILL after `grace`).
    fn stop(&mut self, role: &str, grace: Duration) {
        if let Some(i) = self.children.iter().position(|(r, _)| *r == role) {
            let (_, mut c) = self.children.remove(i);
            terminate(&mut c, grace);
        }
    }
}

fn terminate(c: &mut Child, grace: Duration) {
    // SAFETY: sending SIGTERM to a child we spawned and have not reaped.
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, c) in self.children.iter_mut() {
            terminate(c, Duration::from_secs(2));
        }
    }
}

/// Tears the lab down when a replay that built it ends (however it ends).
struct LabGuard(Option<String>);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            if let Err(e) = lab::down(&n) {
                tracing::warn!("tearing down lab {n}: {e}");
            }
        }
    }
}

/// Polls `f` until it yields a value: `Ok(Err(why))` means not yet (the last `why` goes into
/// the timeout's message), an error ends the wait (and so does Ctrl-C).
fn wait_for<T>(
    what: &'static str,
    limit: Duration,
    stop: &AtomicBool,
    mut alive: impl FnMut() -> bool,
    mut f: impl FnMut() -> Result<Result<T, String>, ReplayError>,
) -> Result<T, ReplayError> {
    let until = Instant::now() + limit;
    loop {
        interrupted(stop)?;
        let last = match f()? {
            Ok(v) => return Ok(v),
            Err(why) => why,
        };
        if !alive() {
            return Err(ReplayError::Role {
                role: what,
                why: "it exited (see its log)".into(),
            });
        }
        if Instant::now() > until {
            return Err(ReplayError::NotReady {
                role: what,
                limit,
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A connection attempt to a role's control channel as [`wait_for`] takes it: refused
/// handshakes end the wait, anything else (no listener yet) is tried again.
fn attempt<T>(r: Result<T, ControlError>) -> Result<Result<T, String>, ReplayError> {
    match r {
        Ok(c) => Ok(Ok(c)),
        Err(e) if e.is_refusal() => Err(e.into()),
        Err(e) => Ok(Err(e.to_string())),
    }
}

fn log_tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// A role's failure to start with the tail of its log; for a role on another host (`remote`:
/// not started here, no log here), that it was not reachable at `addr`.
fn annotate(e: ReplayError, log: &Path, remote: Option<&ControlAddr>) -> ReplayError {
    let Some((role, why)) = e.role_failure() else {
        return e;
    };
    match (e, remote) {
        (ReplayError::NotReady { limit, last, .. }, Some(addr)) => ReplayError::Unreachable {
            role,
            addr: addr.to_string(),
            why: format!("not reachable within {limit:?}{}", last_try(&last)),
        },
        (_, Some(addr)) => ReplayError::Unreachable {
            role,
            addr: addr.to_string(),
            why,
        },
        (_, None) => {
            let tail = log_tail(log);
            ReplayError::Role {
                role,
                why: if tail.is_empty() {
                    format!("{why}; its log {} is empty", log.display())
                } else {
                    format!("{why}; log: {tail}")
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_that_never_answered_is_named_with_its_last_try_or_its_log() {
        let stop = AtomicBool::new(false);
        let timeout = || {
            wait_for(
                NETEMU,
                Duration::from_millis(60),
                &stop,
                || true,
                || Ok::<Result<(), String>, _>(Err("Connection refused".into())),
            )
            .unwrap_err()
        };
        // a remote role: no log here, its address and the last try instead
        let addr: ControlAddr = "tcp:198.18.0.9:7000".parse().unwrap();
        assert_eq!(
            annotate(timeout(), Path::new("/nonexistent"), Some(&addr)).to_string(),
            "network emulator at tcp:198.18.0.9:7000: not reachable within 60ms \
             (last try: Connection refused)"
        );
        // a role started here: the tail of its log, or that the log is empty
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("netemu.log");
        std::fs::write(&log, "starting\nerror: no such interface t-up\n").unwrap();
        assert_eq!(
            annotate(timeout(), &log, None).to_string(),
            "network emulator did not start: not ready within 60ms (last try: Connection \
             refused); log: starting | error: no such interface t-up"
        );
        std::fs::write(&log, "").unwrap();
        let exited = ReplayError::Role {
            role: SERVE,
            why: "it exited (see its log)".into(),
        };
        assert_eq!(
            annotate(exited, &log, None).to_string(),
            format!(
                "server emulator did not start: it exited (see its log); its log {} is empty",
                log.display()
            )
        );
        // other errors pass through unchanged
        assert_eq!(
            annotate(ReplayError::Interrupted, &log, Some(&addr)).to_string(),
            "interrupted"
        );
    }

    #[test]
    fn the_replay_capture_keeps_every_packet_with_real_addresses_and_the_preamble() {
        let c = capture_spec(SourceSpec::Iface("t-srv".into()), Path::new("/w/capture"));
        let args: Vec<String> = quiet(c.to_args())
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "-q",
                "capture",
                "--source",
                "iface:t-srv",
                "-o",
                "/w/capture",
                "--payload-bytes",
                "64",
                "--no-anonymize"
            ]
        );
        assert!(c.settings.rate.is_all());
        // the request preamble (52 bytes) fits in what is kept
        assert!(
            matches!(c.settings.payload, PayloadPolicy::Bytes(n) if n as usize >= crate::preamble::LEN)
        );
    }
}
