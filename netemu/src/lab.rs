//! The three-host lab: network namespaces `NAME-cli`, `NAME-emu`, `NAME-srv`, joined by veth
//! pairs through the emu host, on the benchmarking range 198.18.0.0/15.
//!
//! ```text
//!  NAME-cli                       NAME-emu                        NAME-srv
//!  NAME-c 198.18.0.2/24 ── NAME-ec  [mimic netemu]  NAME-es ── NAME-s 198.18.0.1/24
//!  lo: local 198.19.0.0/19                                        route 198.19.0.0/19 via 198.18.0.2
//! ```
//!
//! The emu host has no addresses: `mimic netemu run` bridges its two interfaces in userspace.
//! The client and the server are on one /24 with static neighbours (fixed, locally administered
//! MAC addresses), so no ARP has to cross the emulator; the client pool 198.19.0.0/19 (8,190
//! usable addresses) is local to the client namespace, so a socket there can bind any of them,
//! and the server routes it back through the emulator. IPv6 is off in all three namespaces,
//! offloads (tso/gso/gro, and tx checksum on the end hosts) are off on every veth.
//!
//! The router and the server host can each run as a QEMU guest on a kernel you name instead
//! ([`up_with_guests`], [`crate::guest`]): the guest's NIC takes the namespace's place on the
//! veth's wire (tc mirred between the veth and the guest's tap); a server guest also has a
//! management link to its namespace ([`SERVER_MGMT_HOST`] ↔ [`SERVER_MGMT_GUEST`]) for the
//! server emulator's control channel.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mimic_core::process::{self, ProcStat};
use serde::Serialize;

use crate::classify::IpNet;
use crate::stack::{self, StackProfile};

pub const LAB_NET: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const CLIENT_POOL: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 0);
pub const CLIENT_POOL_PREFIX: u8 = 19;
/// Longest lab name: interface names (`NAME-ec`) must fit Linux's 15 characters.
pub const MAX_NAME_LEN: usize = 12;
const MAC_CLI: &str = "02:6d:69:00:00:01";
const MAC_EMU_C: &str = "02:6d:69:00:00:02";
const MAC_EMU_S: &str = "02:6d:69:00:00:03";
const MAC_SRV: &str = "02:6d:69:00:00:04";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LabError {
    #[error("bad lab name `{name}`: {why}")]
    BadName { name: String, why: String },
    #[error("lab `{0}` is not up (run `mimic lab up {0}`)")]
    NotUp(String),
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Profile(String),
    #[error(transparent)]
    Guest(#[from] crate::guest::GuestError),
}

/// Options of [`up`].
#[derive(Clone, Debug, Default)]
pub struct LabOptions {
    /// Applied to the server namespace after the lab is built (or, when it already is, again).
    pub stack: Option<StackProfile>,
    /// A process the lab belongs to: once every owner has exited, [`sweep`] takes the lab
    /// down (a test, bench or replay that builds a lab and is killed before its own teardown).
    /// A lab this call builds gets it as its only owner; one already built with owners gets
    /// it as one more; one built without an owner keeps none. None: owners stay as they are.
    pub owner: Option<Owner>,
}

/// A process that owns a lab, named by its pid and its start time (clock ticks after boot,
/// field 22 of `/proc/PID/stat`), so that a pid the kernel has since given to another process
/// does not keep a lab alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub pid: i32,
    pub start_ticks: u64,
}

/// The file in a lab's runtime directory that names its owners (`PID START_TICKS` a line).
const OWNER_FILE: &str = "owner";

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        Owner::of(std::process::id() as i32).expect("this process has a /proc entry")
    }

    /// The running process `pid` (an error names it when there is none).
    pub fn of(pid: i32) -> Result<Owner, LabError> {
        match process::stat(pid) {
            Some(ProcStat {
                start_ticks,
                exited: false,
            }) => Ok(Owner { pid, start_ticks }),
            _ => Err(LabError::Io(format!(
                "no running process {pid} to own the lab (an owner must be running when the lab is built)"
            ))),
        }
    }

    /// Whether the process still runs (the same pid with the same start time, not a zombie).
    pub fn running(&self) -> bool {
        process::stat(self.pid)
            == Some(ProcStat {
                start_ticks: self.start_ticks,
                exited: false,
            })
    }

    /// The owner file's text: one owner a line, at least one.
    fn parse_all(text: &str) -> Option<Vec<Owner>> {
        let owners: Option<Vec<Owner>> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(Owner::parse)
            .collect();
        owners.filter(|o| !o.is_empty())
    }

    fn parse(line: &str) -> Option<Owner> {
        let mut w = line.split_whitespace();
        let owner = Owner {
            pid: w.next()?.parse().ok().filter(|&p: &i32| p > 0)?,
            start_ticks: w.next()?.parse().ok()?,
        };
        w.next().is_none().then_some(owner)
    }
}

/// Replaces the lab's owner file (written aside and renamed: a reader sees the old list or
/// the new one).
fn write_owners(info: &LabInfo, owners: &[Owner]) -> Result<(), LabError> {
    std::fs::create_dir_all(&info.runtime_dir)
        .map_err(|e| LabError::Io(format!("{}: {e}", info.runtime_dir.display())))?;
    let path = info.runtime_dir.join(OWNER_FILE);
    let tmp = info
        .runtime_dir
        .join(format!(".{OWNER_FILE}.{}", std::process::id()));
    let text: String = owners
        .iter()
        .map(|o| format!("{} {}\n", o.pid, o.start_ticks))
        .collect();
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| LabError::Io(format!("{}: {e}", path.display())))
}

/// The owners recorded for the lab: None when it has no owner file; an error saying what is
/// wrong with one that cannot be read as a list of owners.
fn read_owners(info: &LabInfo) -> Result<Option<Vec<Owner>>, String> {
    let path = info.runtime_dir.join(OWNER_FILE);
    match std::fs::read_to_string(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
        Ok(text) => Owner::parse_all(&text).map(Some).ok_or_else(|| {
            format!(
                "{}: not lines of `PID START_TICKS`: {:?}",
                path.display(),
                text.trim()
            )
        }),
    }
}

/// One recorded owner of a lab and whether it runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OwnerState {
    pub pid: i32,
    pub start_ticks: u64,
    pub running: bool,
}

/// What a lab's runtime directory says of its owners.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Ownership {
    /// No owner recorded: the lab stays until `mimic lab down`.
    None,
    /// At least one owner runs.
    Running { owners: Vec<OwnerState> },
    /// Every owner has exited: [`sweep`] takes the lab down.
    Exited { owners: Vec<OwnerState> },
    /// The owner file cannot be read as a list of owners: the lab is left alone.
    Unreadable { why: String },
}

fn ownership(info: &LabInfo) -> Ownership {
    match read_owners(info) {
        Ok(None) => Ownership::None,
        Err(why) => Ownership::Unreadable { why },
        Ok(Some(list)) => {
            let owners: Vec<OwnerState> = list
                .iter()
                .map(|o| OwnerState {
                    pid: o.pid,
                    start_ticks: o.start_ticks,
                    running: o.running(),
                })
                .collect();
            if owners.iter().any(|o| o.running) {
                Ownership::Running { owners }
            } else {
                Ownership::Exited { owners }
            }
        }
    }
}

/// Adds `owner` to a complete lab's owners: one built without an owner keeps none (a note
/// says so), one whose owner file is unreadable is left as it is (likewise).
fn add_owner(info: &LabInfo, owner: &Owner, notes: &mut Vec<String>) -> Result<(), LabError> {
    match read_owners(info) {
        Ok(Some(mut owners)) => {
            if !owners.contains(owner) {
                owners.push(*owner);
                write_owners(info, &owners)?;
            }
        }
        Ok(None) => notes.push(format!(
            "lab {} was built without an owner and keeps none (`lab sweep` leaves it; `lab down` removes it)",
            info.name
        )),
        Err(why) => notes.push(format!(
            "lab {}: its owners are not recorded ({why}); `lab sweep` leaves it",
            info.name
        )),
    }
    Ok(())
}

/// Lab hosts to run as QEMU guests (see [`crate::guest`]) instead of namespaces.
#[derive(Clone, Debug)]
pub struct GuestOptions {
    /// The kernel the router host (`emu`) boots; `None`: the emu host stays a namespace.
    pub router_kernel: Option<crate::guest::KernelImage>,
    /// The kernel the server host (`srv`) boots (`--server-kernel`: the kernel you changed);
    /// `None`: the srv host stays a namespace.
    pub server_kernel: Option<crate::guest::KernelImage>,
    /// How long a guest may take to answer on its command channel after QEMU starts.
    pub boot_timeout: Duration,
    /// Guest memory (MiB).
    pub memory_mb: u32,
    /// SCHED_FIFO priority of the guests' QEMU threads once booted (None: normal scheduling).
    pub fifo_priority: Option<i32>,
    /// Extra kernel command-line words for every guest booted (checked by
    /// [`crate::guest::parse_cmdline`]), e.g. `highres=off` for tick-resolution timers.
    pub cmdline: Vec<String>,
}

impl Default for GuestOptions {
    fn default() -> Self {
        GuestOptions {
            router_kernel: None,
            server_kernel: None,
            boot_timeout: Duration::from_secs(90),
            memory_mb: 768,
            fifo_priority: Some(20),
            cmdline: Vec::new(),
        }
    }
}

/// MACs of the router guest's NICs (towards the client, towards the server).
const MAC_GUEST_C: &str = "02:6d:69:00:01:02";
const MAC_GUEST_S: &str = "02:6d:69:00:01:03";
/// MAC of the server guest's management NIC (its data NIC takes the server's own, `MAC_SRV`,
/// which the client's static neighbour entry names).
const MAC_GUEST_SRV_MGMT: &str = "02:6d:69:00:02:01";
/// The server guest's management link (a /30 between `NAME-srv` and the guest, outside the
/// data path): the server emulator's control channel runs over it, since the guest cannot see
/// the host's unix sockets.
pub const SERVER_MGMT_HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 1);
pub const SERVER_MGMT_GUEST: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 2);
/// The guest-side name of the management NIC.
pub const SERVER_MGMT_IF: &str = "mgmt0";
/// TCP port of the server emulator's control channel in a server guest.
pub const SERVER_GUEST_CONTROL_PORT: u16 = 7301;

/// Names and addresses of a lab (pure: computed from the name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LabInfo {
    pub name: String,
    pub ns_cli: String,
    pub ns_emu: String,
    pub ns_srv: String,
    /// Client's interface (in `ns_cli`).
    pub cli_if: String,
    /// Emulator's interface towards the client (in `ns_emu`).
    pub emu_cli_if: String,
    /// Emulator's interface towards the server (in `ns_emu`).
    pub emu_srv_if: String,
    /// When the emu host is a guest: the taps of its NICs in `ns_emu` (towards the client,
    /// towards the server); inside the guest the NICs are named `emu_cli_if`/`emu_srv_if`.
    pub emu_cli_tap: String,
    pub emu_srv_tap: String,
    /// When the srv host is a guest: the taps of its data NIC (joined to `srv_if`) and of its
    /// management NIC (`SERVER_MGMT_HOST` on this side), both in `ns_srv`.
    pub srv_tap: String,
    pub srv_mgmt_tap: String,
    /// Server's interface (in `ns_srv`): capture here to see what the server sees.
    pub srv_if: String,
    pub server_addr: Ipv4Addr,
    /// The client interface's own address.
    pub client_addr: Ipv4Addr,
    /// Addresses a socket in `ns_cli` can bind as its source (routed through the emulator).
    pub client_pool: IpNet,
    pub runtime_dir: PathBuf,
    /// Where `mimic netemu run --lab NAME` listens by default (`unix:PATH`).
    pub control: String,
    /// The control channel's PKI (`mimic pki init` run by `up`: the CA certificate, the
    /// controller's and each role's certificate and key).
    pub pki_dir: PathBuf,
}

impl LabInfo {
    pub fn for_name(name: &str) -> Result<LabInfo, LabError> {
        validate_name(name)?;
        let dir = runtime_dir(name);
        Ok(LabInfo {
            name: name.into(),
            ns_cli: format!("{name}-cli"),
            ns_emu: format!("{name}-emu"),
            ns_srv: format!("{name}-srv"),
            cli_if: format!("{name}-c"),
            emu_cli_if: format!("{name}-ec"),
            emu_srv_if: format!("{name}-es"),
            emu_cli_tap: format!("{name}-tc"),
            emu_srv_tap: format!("{name}-ts"),
            srv_tap: format!("{name}-vs"),
            srv_mgmt_tap: format!("{name}-vm"),
            srv_if: format!("{name}-s"),
            server_addr: SERVER_ADDR,
            client_addr: CLIENT_ADDR,
            client_pool: IpNet {
                addr: CLIENT_POOL.into(),
                prefix: CLIENT_POOL_PREFIX,
            },
            control: format!("unix:{}", dir.join("netemu.sock").display()),
            pki_dir: dir.join("pki"),
            runtime_dir: dir,
        })
    }

    /// Number of usable pool addresses (the all-zeros and all-ones host parts are skipped).
    pub fn pool_len(&self) -> u32 {
        (1u32 << (32 - CLIENT_POOL_PREFIX)) - 2
    }

    /// The `i`-th usable client pool address (0-based), `None` past the end.
    pub fn pool_addr(&self, i: u32) -> Option<Ipv4Addr> {
        (i < self.pool_len()).then(|| Ipv4Addr::from(u32::from(CLIENT_POOL) + 1 + i))
    }

    pub fn namespaces(&self) -> [&str; 3] {
        [&self.ns_cli, &self.ns_emu, &self.ns_srv]
    }

    /// Where a server emulator in the server guest listens for the control channel
    /// (`tcp:198.18.255.2:7301`, reached from `ns_srv` over the management link).
    pub fn server_guest_control(&self) -> String {
        format!("tcp:{SERVER_MGMT_GUEST}:{SERVER_GUEST_CONTROL_PORT}")
    }

    /// The controller's side of the lab's control channel.
    pub fn controller_tls(&self) -> Result<mimic_control::ControllerTls, LabError> {
        mimic_control::ControllerTls::load(&self.pki_dir).map_err(|e| LabError::Io(e.to_string()))
    }
}

/// Per-lab directory for sockets, the control channel's PKI and pid files.
pub fn runtime_dir(name: &str) -> PathBuf {
    Path::new("/run/mimic").join(name)
}

pub fn validate_name(name: &str) -> Result<(), LabError> {
    let bad = |why: &str| {
        Err(LabError::BadName {
            name: name.into(),
            why: why.into(),
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad(&format!("at most {MAX_NAME_LEN} characters (interface names like `{name}-ec` must fit Linux's 15)"));
    }
    if !name.chars().next().unwrap().is_ascii_alphabetic() {
        return bad("it must start with a letter");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return bad("use only letters, digits, `-` and `_`");
    }
    Ok(())
}

/// Runs a command; its stdout on success, its stderr in the error otherwise.
pub(crate) fn run(mut c: Command) -> Result<String, LabError> {
    let desc = format!("{c:?}").replace('"', "");
    let out = c.output().map_err(|e| LabError::Command {
        cmd: desc.clone(),
        stderr: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: desc,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn ip(args: &[&str]) -> Result<String, LabError> {
    let mut c = Command::new("ip");
    c.args(args);
    run(c)
}

pub(crate) fn ip_in(ns: &str, args: &[String]) -> Result<String, LabError> {
    let mut c = Command::new("ip");
    c.args(["-n", ns]).args(args);
    run(c)
}

fn ipn(ns: &str, args: &str) -> Result<String, LabError> {
    let v: Vec<String> = args.split_whitespace().map(String::from).collect();
    ip_in(ns, &v)
}

fn link_exists(ns: &str, dev: &str) -> bool {
    exists_ns(ns) && ipn(ns, &format!("link show dev {dev}")).is_ok()
}

fn exists_ns(ns: &str) -> bool {
    crate::netns::exists(ns)
}

fn marker(info: &LabInfo) -> PathBuf {
    info.runtime_dir.join("lab.ok")
}

/// Whether every namespace and interface of the lab exists and the build completed (and its
/// guest, if it has one, still runs).
fn complete(info: &LabInfo) -> bool {
    let guest_ok = ["emu", "srv"].iter().all(|role| {
        match crate::guest::load_record(&info.runtime_dir, role) {
            Some(r) => crate::guest::alive(r.pid),
            None => true,
        }
    });
    guest_ok
        && marker(info).exists()
        && info.namespaces().iter().all(|n| exists_ns(n))
        && link_exists(&info.ns_cli, &info.cli_if)
        && link_exists(&info.ns_emu, &info.emu_cli_if)
        && link_exists(&info.ns_emu, &info.emu_srv_if)
        && link_exists(&info.ns_srv, &info.srv_if)
}

fn ethtool(ns: &str, dev: &str, features: &[&str]) -> Result<(), LabError> {
    let mut args = vec!["-K", dev];
    args.extend_from_slice(features);
    run(crate::netns::command(ns, "ethtool", args)).map(|_| ())
}

/// Makes the lab's PKI (once: a lab that is up keeps its files, so running roles stay
/// reachable).
fn make_pki(info: &LabInfo) -> Result<(), LabError> {
    if mimic_control::ControllerTls::load(&info.pki_dir).is_ok()
        && mimic_control::pki::ROLES
            .iter()
            .all(|r| mimic_control::RoleTls::load(&info.pki_dir, r).is_ok())
    {
        return Ok(());
    }
    mimic_control::pki::init(
        &info.pki_dir,
        &mimic_control::pki::InitOptions {
            force: true,
            ..Default::default()
        },
    )
    .map(|_| ())
    .map_err(|e| LabError::Io(format!("making the lab's control channel PKI: {e}")))
}

/// Builds the lab (or checks that it is built). Idempotent: when the lab is complete it is
/// left as it is (a running emulator keeps running) and only the stack profile is applied.
/// A half-built lab (e.g. after a crash) is torn down and rebuilt.
pub fn up(name: &str, opts: &LabOptions) -> Result<(LabInfo, Vec<String>), LabError> {
    up_with_guests(name, opts, &GuestOptions::default())
}

/// [`up`], with the router host on the kernel `guests` names (a QEMU guest, see
/// [`crate::guest`]). A complete lab is left as it is unless `guests` names a kernel its router
/// does not run (then it is rebuilt); a half-built one is rebuilt.
pub fn up_with_guests(
    name: &str,
    opts: &LabOptions,
    guests: &GuestOptions,
) -> Result<(LabInfo, Vec<String>), LabError> {
    let info = LabInfo::for_name(name)?;
    let mut notes = Vec::new();
    // A guest runs what was asked for when its image and its extra command line both match.
    let image = |role: &str| {
        crate::guest::load_record(&info.runtime_dir, role).map(|r| (r.kernel.image, r.cmdline))
    };
    let want = |k: &Option<crate::guest::KernelImage>| {
        k.as_ref()
            .map(|k| (k.image.clone(), guests.cmdline.clone()))
    };
    let want_emu = want(&guests.router_kernel);
    let want_srv = want(&guests.server_kernel);
    // A plain `up` (no kernel named) leaves a complete guest lab as it is, as it leaves a
    // running emulator: only a kernel asked for and not running rebuilds.
    let stale = (want_emu.is_some() && image("emu") != want_emu)
        || (want_srv.is_some() && image("srv") != want_srv);
    let rebuild = !complete(&info) || stale;
    if rebuild {
        down(name)?;
        // the owner first: a lab half built when its owner is killed is swept like any other
        if let Some(o) = &opts.owner {
            write_owners(&info, &[*o])?;
        }
        let built = build(&info)
            .and_then(|_| match &guests.router_kernel {
                Some(k) => boot_router(&info, k, guests),
                None => Ok(()),
            })
            .and_then(|_| match &guests.server_kernel {
                Some(k) => boot_server(&info, k, guests),
                None => Ok(()),
            });
        if let Err(e) = built {
            let _ = down(name);
            return Err(e);
        }
    }
    for (role, what, ns) in [
        ("emu", "router", &info.ns_emu),
        ("srv", "server", &info.ns_srv),
    ] {
        if let Some(r) = crate::guest::load_record(&info.runtime_dir, role) {
            notes.push(format!(
                "{what} host {ns} is a {} guest on kernel {} (booted in {:.1} s; {})",
                r.accel, r.kernel.version, r.boot_secs, r.accel_why
            ));
        }
    }
    if let Some(o) = opts.owner.as_ref().filter(|_| !rebuild) {
        add_owner(&info, o, &mut notes)?;
    }
    if let Some(p) = &opts.stack {
        notes.extend(stack::apply(name, p)?);
    }
    Ok((info, notes))
}

fn build(info: &LabInfo) -> Result<(), LabError> {
    std::fs::create_dir_all(&info.runtime_dir)
        .map_err(|e| LabError::Io(format!("{}: {e}", info.runtime_dir.display())))?;
    for ns in info.namespaces() {
        ip(&["netns", "add", ns])?;
    }
    ip(&[
        "link",
        "add",
        &info.cli_if,
        "netns",
        &info.ns_cli,
        "address",
        MAC_CLI,
        "type",
        "veth",
        "peer",
        "name",
        &info.emu_cli_if,
        "netns",
        &info.ns_emu,
        "address",
        MAC_EMU_C,
    ])?;
    ip(&[
        "link",
        "add",
        &info.emu_srv_if,
        "netns",
        &info.ns_emu,
        "address",
        MAC_EMU_S,
        "type",
        "veth",
        "peer",
        "name",
        &info.srv_if,
        "netns",
        &info.ns_srv,
        "address",
        MAC_SRV,
    ])?;
    for ns in info.namespaces() {
        stack::sysctl_in(
            ns,
            &[
                ("net.ipv6.conf.all.disable_ipv6", "1"),
                ("net.ipv6.conf.default.disable_ipv6", "1"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ],
        )?;
        ipn(ns, "link set lo up")?;
    }
    // Wide ephemeral port range on the client: replay opens many connections.
    stack::sysctl_in(
        &info.ns_cli,
        &[("net.ipv4.ip_local_port_range", "1024 65535")],
    )?;
    let (c, s) = (&info.ns_cli, &info.ns_srv);
    ipn(c, &format!("addr add {CLIENT_ADDR}/24 dev {}", info.cli_if))?;
    ipn(s, &format!("addr add {SERVER_ADDR}/24 dev {}", info.srv_if))?;
    for (ns, dev) in [
        (c, &info.cli_if),
        (&info.ns_emu, &info.emu_cli_if),
        (&info.ns_emu, &info.emu_srv_if),
        (s, &info.srv_if),
    ] {
        ethtool(ns, dev, &["tso", "off", "gso", "off", "gro", "off"])?;
        ipn(ns, &format!("link set {dev} up"))?;
    }
    for (ns, dev) in [(c, &info.cli_if), (s, &info.srv_if)] {
        ethtool(ns, dev, &["tx", "off"])?;
    }
    for dev in [&info.emu_cli_if, &info.emu_srv_if] {
        ipn(&info.ns_emu, &format!("link set {dev} promisc on"))?;
    }
    ipn(c, &format!("route add local {} dev lo", info.client_pool))?;
    ipn(
        s,
        &format!(
            "route add {} via {CLIENT_ADDR} dev {}",
            info.client_pool, info.srv_if
        ),
    )?;
    ipn(
        c,
        &format!(
            "neigh replace {SERVER_ADDR} lladdr {MAC_SRV} dev {} nud permanent",
            info.cli_if
        ),
    )?;
    ipn(
        s,
        &format!(
            "neigh replace {CLIENT_ADDR} lladdr {MAC_CLI} dev {} nud permanent",
            info.srv_if
        ),
    )?;
    make_pki(info)?;
    std::fs::write(marker(info), b"ok\n")
        .map_err(|e| LabError::Io(format!("{}: {e}", marker(info).display())))?;
    Ok(())
}

/// The guest spec of lab host `role` (`emu` or `srv`), running in namespace `netns` with `nics`.
fn guest_spec(
    info: &LabInfo,
    role: &str,
    netns: &str,
    kernel: &crate::guest::KernelImage,
    nics: Vec<crate::guest::GuestNic>,
    opts: &GuestOptions,
) -> crate::guest::GuestSpec {
    crate::guest::GuestSpec {
        role: role.into(),
        netns: netns.into(),
        kernel: kernel.clone(),
        nics,
        memory_mb: opts.memory_mb,
        boot_timeout: opts.boot_timeout,
        runtime_dir: info.runtime_dir.clone(),
        fifo_priority: opts.fifo_priority,
        cmdline: opts.cmdline.clone(),
    }
}

/// Joins each `(veth, tap)` pair in `ns` with tc mirred redirects on both ingresses (every
/// frame, both ways), offloads off and the taps up: the guest NIC behind the tap takes the
/// veth's place on its wire.
fn join_taps(ns: &str, pairs: &[(String, String)]) -> Result<(), String> {
    let tc = |args: &str| {
        let v: Vec<&str> = args.split_whitespace().collect();
        run(crate::netns::command(ns, "tc", v)).map_err(|e| e.to_string())
    };
    for (veth, tap) in pairs {
        ethtool(ns, tap, &["tso", "off", "gso", "off", "gro", "off"]).map_err(|e| e.to_string())?;
        ipn(ns, &format!("link set {tap} up")).map_err(|e| e.to_string())?;
        for (a, b) in [(veth, tap), (tap, veth)] {
            tc(&format!("qdisc add dev {a} handle ffff: ingress"))?;
            tc(&format!(
                "filter add dev {a} parent ffff: protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev {b}"
            ))?;
        }
    }
    Ok(())
}

/// Shell lines (for the guest) that find each NIC by its MAC and rename it to the name it has
/// in the lab, offloads off.
fn name_nics_script(nics: &[crate::guest::GuestNic]) -> String {
    let mut script = String::new();
    for n in nics {
        script.push_str(&format!(
            "d=''; for p in /sys/class/net/*; do [ \"$(cat $p/address)\" = {mac} ] && d=${{p##*/}}; done\n\
             [ -n \"$d\" ] || {{ echo 'no NIC with MAC {mac}' >&2; exit 1; }}\n\
             ip link set dev $d name {name}\n\
             ethtool -K {name} tso off gso off gro off\n",
            mac = n.mac,
            name = n.guest_name
        ));
    }
    script
}

/// Boots the router guest in the emu namespace: its taps are joined to the emu veths by tc
/// mirred redirects (both ways, every frame), and inside the guest a bridge joins its two
/// NICs, renamed after the veths they stand for, so pipes go on their egress.
fn boot_router(
    info: &LabInfo,
    kernel: &crate::guest::KernelImage,
    opts: &GuestOptions,
) -> Result<(), LabError> {
    use crate::guest::{self, GuestNic};
    let spec = guest_spec(
        info,
        "emu",
        &info.ns_emu,
        kernel,
        vec![
            GuestNic {
                tap: info.emu_cli_tap.clone(),
                guest_name: info.emu_cli_if.clone(),
                mac: MAC_GUEST_C.into(),
            },
            GuestNic {
                tap: info.emu_srv_tap.clone(),
                guest_name: info.emu_srv_if.clone(),
                mac: MAC_GUEST_S.into(),
            },
        ],
        opts,
    );
    let pairs = [
        (info.emu_cli_if.clone(), info.emu_cli_tap.clone()),
        (info.emu_srv_if.clone(), info.emu_srv_tap.clone()),
    ];
    let rec = guest::boot(&spec, &mut || join_taps(&info.ns_emu, &pairs))?;
    let mut script = String::from(
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1\n\
         ip link set lo up\n\
         ip link add br0 type bridge stp_state 0 forward_delay 0\n",
    );
    script.push_str(&name_nics_script(&rec.nics));
    for n in &rec.nics {
        script.push_str(&format!(
            "ip link set {name} master br0\nip link set {name} up\n",
            name = n.guest_name
        ));
    }
    script.push_str("ip link set br0 up\n");
    guest::exec_ok(&rec, &["sh", "-ec", &script])?;
    Ok(())
}

/// Boots the server guest in the srv namespace. Its data NIC takes the server's place on the
/// wire: it has the server's MAC and address, the route to the client pool and the static
/// neighbour the namespace had, and its tap is joined to `srv_if` (whose address is removed,
/// so the namespace itself takes no part; a capture on `srv_if` still sees every frame, as a
/// tap in front of the server would). Its management NIC is a /30 to `ns_srv`
/// ([`SERVER_MGMT_HOST`] ↔ [`SERVER_MGMT_GUEST`]) that carries the server emulator's control
/// channel. The guest gets the server role's control-channel files (`ca.crt`, `serve.crt`,
/// `serve.key`, not the CA's key) at the lab's PKI path, so `mimic serve --pki` reads them
/// where it would on the host.
fn boot_server(
    info: &LabInfo,
    kernel: &crate::guest::KernelImage,
    opts: &GuestOptions,
) -> Result<(), LabError> {
    use crate::guest::{self, GuestNic};
    let spec = guest_spec(
        info,
        "srv",
        &info.ns_srv,
        kernel,
        vec![
            GuestNic {
                tap: info.srv_tap.clone(),
                guest_name: info.srv_if.clone(),
                mac: MAC_SRV.into(),
            },
            GuestNic {
                tap: info.srv_mgmt_tap.clone(),
                guest_name: SERVER_MGMT_IF.into(),
                mac: MAC_GUEST_SRV_MGMT.into(),
            },
        ],
        opts,
    );
    let ns = info.ns_srv.clone();
    let pairs = [(info.srv_if.clone(), info.srv_tap.clone())];
    let mgmt = info.srv_mgmt_tap.clone();
    let srv_if = info.srv_if.clone();
    let mut wire = || -> Result<(), String> {
        // the namespace hands the server's address to the guest
        ipn(&ns, &format!("addr flush dev {srv_if}")).map_err(|e| e.to_string())?;
        join_taps(&ns, &pairs)?;
        ipn(&ns, &format!("addr add {SERVER_MGMT_HOST}/30 dev {mgmt}"))
            .map_err(|e| e.to_string())?;
        ipn(&ns, &format!("link set {mgmt} up")).map_err(|e| e.to_string())?;
        Ok(())
    };
    let rec = guest::boot(&spec, &mut wire)?;
    let mut script = String::from(
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
         net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0\n\
         ip link set lo up\n",
    );
    script.push_str(&name_nics_script(&rec.nics));
    let s = &info.srv_if;
    script.push_str(&format!(
        "ethtool -K {s} tx off\n\
         ip addr add {SERVER_ADDR}/24 dev {s}\n\
         ip link set {s} up\n\
         ip route add {pool} via {CLIENT_ADDR} dev {s}\n\
         ip neigh replace {CLIENT_ADDR} lladdr {MAC_CLI} dev {s} nud permanent\n\
         ip addr add {SERVER_MGMT_GUEST}/30 dev {SERVER_MGMT_IF}\n\
         ip link set {SERVER_MGMT_IF} up\n",
        pool = info.client_pool
    ));
    guest::exec_ok(&rec, &["sh", "-ec", &script])?;
    // The serve role's files, written in the guest's own /run (umask 077: the key stays 0600).
    let pki = info.pki_dir.display().to_string();
    let mut copy = format!("umask 077\nmkdir -p '{pki}'\n");
    let mut args: Vec<String> = Vec::new();
    for (i, f) in ["ca.crt", "serve.crt", "serve.key"].iter().enumerate() {
        let p = info.pki_dir.join(f);
        let text = std::fs::read_to_string(&p)
            .map_err(|e| LabError::Io(format!("{}: {e}", p.display())))?;
        copy.push_str(&format!("printf '%s' \"${}\" > '{pki}/{f}'\n", i + 1));
        args.push(text);
    }
    let mut argv: Vec<&str> = vec!["sh", "-ec", &copy, "sh"];
    argv.extend(args.iter().map(String::as_str));
    guest::exec_ok(&rec, &argv)?;
    Ok(())
}

/// The most client hosts a lab can have (`mimic lab up NAME --clients N`).
pub const MAX_CLIENTS: u32 = 8;

/// Client host `k` (1-based) of a lab: host 1 is `NAME-cli`, the others `NAME-cliK`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClientHost {
    /// `cli`, `cli2`, …: the name `mimic replay --agents` and `mimic lab exec` take.
    pub role: String,
    pub ns: String,
    /// Its interface (in `ns`).
    pub iface: String,
    /// Its port on the client segment's switch (in the emu namespace); None for host 1 of a
    /// lab with one client host (wired straight to the emulator).
    pub switch_port: String,
    /// The interface's own address: 198.18.0.(1+k).
    pub addr: Ipv4Addr,
    pub mac: String,
    /// Addresses local to the host, routed back to it by the server: host 1 has
    /// 198.19.0.0/19, host k 198.19.(32(k-1)).0/19.
    pub pool: IpNet,
}

impl LabInfo {
    /// Client host `k` (1..=[`MAX_CLIENTS`]).
    pub fn client_host(&self, k: u32) -> Option<ClientHost> {
        if k == 0 || k > MAX_CLIENTS {
            return None;
        }
        let n = &self.name;
        let (role, ns, iface) = if k == 1 {
            ("cli".to_string(), self.ns_cli.clone(), self.cli_if.clone())
        } else {
            (
                format!("cli{k}"),
                format!("{n}-cli{k}"),
                format!("{n}-c{k}"),
            )
        };
        Some(ClientHost {
            role,
            ns,
            iface,
            switch_port: format!("{n}-e{k}"),
            addr: Ipv4Addr::from(u32::from(CLIENT_ADDR) + k - 1),
            mac: if k == 1 {
                MAC_CLI.to_string()
            } else {
                format!("02:6d:69:00:02:{k:02x}")
            },
            pool: IpNet {
                addr: Ipv4Addr::from(
                    u32::from(CLIENT_POOL) + ((k - 1) << (32 - CLIENT_POOL_PREFIX)),
                )
                .into(),
                prefix: CLIENT_POOL_PREFIX,
            },
        })
    }

    /// The client host named `role` (`cli`, `cli2`, …).
    pub fn client_host_named(&self, role: &str) -> Option<ClientHost> {
        match role {
            "cli" => self.client_host(1),
            // `cli2`, `cli10`: the number as the lab names its hosts (not `cli02`, `cli+2`)
            r => r
                .strip_prefix("cli")
                .filter(|k| !k.starts_with(['0', '+']))
                .and_then(|k| k.parse::<u32>().ok())
                .filter(|&k| k >= 2)
                .and_then(|k| self.client_host(k)),
        }
    }

    /// The client segment's switch (a bridge in the emu namespace) once the lab has more than
    /// one client host, and the veth end that joins it to the emulator's `emu_cli_if`.
    fn switch(&self) -> (String, String) {
        (format!("{}-cb", self.name), format!("{}-eb", self.name))
    }
}

/// The number of client hosts lab `name` has (1 unless `--clients` added more).
pub fn client_count(name: &str) -> Result<u32, LabError> {
    let info = LabInfo::for_name(name)?;
    Ok(std::fs::read_to_string(info.runtime_dir.join("clients"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1))
}

/// Gives a built lab `n` client hosts (`NAME-cli`, `NAME-cli2`, …, each with its own TCP
/// stack, interface address 198.18.0.(1+k) and address pool, see [`ClientHost`]). With more
/// than one, the client segment becomes a switch: a bridge in the emu namespace joins the
/// hosts' veths and one more veth whose other end, `NAME-ec`, is what the emulator bridges as
/// before; the server routes each pool to its host's address (static neighbours, static
/// switch entries, so nothing is learnt or flooded). Idempotent; a lab never loses hosts here
/// (`lab down` removes them all). Run it with no emulator on the lab: rewiring `NAME-ec`
/// would pull the interface from under it.
pub fn add_clients(name: &str, n: u32) -> Result<Vec<ClientHost>, LabError> {
    let info = LabInfo::for_name(name)?;
    if !(1..=MAX_CLIENTS).contains(&n) {
        return Err(LabError::Io(format!(
            "--clients must be 1..={MAX_CLIENTS}, not {n}"
        )));
    }
    if !complete(&info) {
        return Err(LabError::NotUp(name.into()));
    }
    let have = client_count(name)?;
    let hosts: Vec<ClientHost> = (1..=n.max(have))
        .filter_map(|k| info.client_host(k))
        .collect();
    if n <= have {
        return Ok(hosts);
    }
    if crate::guest::load_record(&info.runtime_dir, "emu").is_some() {
        return Err(LabError::Io(format!(
            "lab {name}: more client hosts on a lab whose router is a guest are not supported"
        )));
    }
    if crate::guest::load_record(&info.runtime_dir, "srv").is_some() {
        return Err(LabError::Io(format!(
            "lab {name}: more client hosts on a lab whose server host is a guest are not supported \
             (its routes to the added pools would have to be set in the guest)"
        )));
    }
    let emu = &info.ns_emu;
    let (bridge, bport) = info.switch();
    if have == 1 {
        // host 1 moves from the emulator's veth to a switch port
        ipn(emu, &format!("link del {}", info.emu_cli_if))?;
        ipn(
            emu,
            &format!(
                "link add {} address {MAC_EMU_C} type veth peer name {bport}",
                info.emu_cli_if
            ),
        )?;
        ipn(
            emu,
            &format!("link add {bridge} type bridge stp_state 0 forward_delay 0"),
        )?;
        ipn(emu, &format!("link set {bport} master {bridge}"))?;
        for dev in [&info.emu_cli_if, &bport] {
            ethtool(emu, dev, &["tso", "off", "gso", "off", "gro", "off"])?;
            ipn(emu, &format!("link set {dev} up"))?;
        }
        ipn(emu, &format!("link set {} promisc on", info.emu_cli_if))?;
        ipn(emu, &format!("link set {bridge} up"))?;
    }
    let s = &info.ns_srv;
    for h in hosts.iter().skip(if have == 1 { 0 } else { have as usize }) {
        let k = h.addr.octets()[3] as u32 - 1;
        if k > 1 {
            ip(&["netns", "add", &h.ns])?;
            stack::sysctl_in(
                &h.ns,
                &[
                    ("net.ipv6.conf.all.disable_ipv6", "1"),
                    ("net.ipv6.conf.default.disable_ipv6", "1"),
                    ("net.ipv4.conf.all.rp_filter", "0"),
                    ("net.ipv4.conf.default.rp_filter", "0"),
                    ("net.ipv4.ip_local_port_range", "1024 65535"),
                ],
            )?;
            ipn(&h.ns, "link set lo up")?;
        }
        ip(&[
            "link",
            "add",
            &h.iface,
            "netns",
            &h.ns,
            "address",
            &h.mac,
            "type",
            "veth",
            "peer",
            "name",
            &h.switch_port,
            "netns",
            emu,
        ])?;
        ipn(&h.ns, &format!("addr add {}/24 dev {}", h.addr, h.iface))?;
        ethtool(&h.ns, &h.iface, &["tso", "off", "gso", "off", "gro", "off"])?;
        ethtool(&h.ns, &h.iface, &["tx", "off"])?;
        ethtool(
            emu,
            &h.switch_port,
            &["tso", "off", "gso", "off", "gro", "off"],
        )?;
        ipn(emu, &format!("link set {} master {bridge}", h.switch_port))?;
        ipn(emu, &format!("link set {} up", h.switch_port))?;
        ipn(&h.ns, &format!("link set {} up", h.iface))?;
        let mut fdb = Command::new("bridge");
        fdb.args(["-n", emu, "fdb", "replace", &h.mac, "dev", &h.switch_port])
            .args(["master", "static"]);
        run(fdb)?;
        if k > 1 {
            ipn(&h.ns, &format!("route add local {} dev lo", h.pool))?;
            ipn(
                s,
                &format!(
                    "neigh replace {} lladdr {} dev {} nud permanent",
                    h.addr, h.mac, info.srv_if
                ),
            )?;
            ipn(
                s,
                &format!("route add {} via {} dev {}", h.pool, h.addr, info.srv_if),
            )?;
        }
        ipn(
            &h.ns,
            &format!(
                "neigh replace {SERVER_ADDR} lladdr {MAC_SRV} dev {} nud permanent",
                h.iface
            ),
        )?;
    }
    let mut fdb = Command::new("bridge");
    fdb.args(["-n", emu, "fdb", "replace", MAC_SRV, "dev", &bport])
        .args(["master", "static"]);
    run(fdb)?;
    let f = info.runtime_dir.join("clients");
    std::fs::write(&f, format!("{n}\n"))
        .map_err(|e| LabError::Io(format!("{}: {e}", f.display())))?;
    Ok(hosts)
}

/// What runs a lab host's commands.
#[derive(Clone, Debug)]
pub enum Host {
    /// A network namespace of this machine (`ip netns exec`).
    Namespace(String),
    /// A QEMU guest (its command channel).
    Guest(Box<crate::guest::GuestRecord>),
}

/// The host of `role` (`cli`, `emu` or `srv`) in lab `name`.
pub fn host(name: &str, role: &str) -> Result<Host, LabError> {
    let info = LabInfo::for_name(name)?;
    let extra = info.client_host_named(role).map(|h| h.ns);
    let ns = match role {
        "emu" => &info.ns_emu,
        "srv" => &info.ns_srv,
        _ => match &extra {
            Some(ns) => ns,
            None => {
                return Err(LabError::Io(format!(
                    "unknown lab host `{role}` (use cli, emu or srv; cli2 … in a lab with more client hosts)"
                )))
            }
        },
    };
    if !exists_ns(ns) {
        return Err(LabError::NotUp(name.into()));
    }
    Ok(match crate::guest::load_record(&info.runtime_dir, role) {
        Some(r) => Host::Guest(Box::new(r)),
        None => Host::Namespace(ns.clone()),
    })
}

/// The kernel release a host runs (`uname -r` there).
pub fn host_kernel(h: &Host) -> Result<String, LabError> {
    match h {
        Host::Namespace(_) => std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .map_err(|e| LabError::Io(format!("/proc/sys/kernel/osrelease: {e}"))),
        // Bounded: `lab status` must not hang behind a long `lab exec`.
        Host::Guest(r) => {
            Ok(
                crate::guest::exec_ok_within(r, &["uname", "-r"], Duration::from_secs(10))?
                    .trim()
                    .to_string(),
            )
        }
    }
}

/// What [`down`] removed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DownReport {
    pub killed: Vec<i32>,
    /// QEMU processes of the lab's guests that were killed.
    pub guests: Vec<i32>,
    pub namespaces: Vec<String>,
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence; no signal is sent.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Tears the lab down completely: kills every process in its namespaces (TERM, then KILL after
/// two seconds), deletes the namespaces (and with them the veths) and the runtime directory.
/// Works on partial labs and on labs that never existed.
pub fn down(name: &str) -> Result<DownReport, LabError> {
    let info = LabInfo::for_name(name)?;
    let mut report = DownReport::default();
    for role in ["cli", "emu", "srv"] {
        report
            .guests
            .extend(crate::guest::kill(&info.runtime_dir, role));
    }
    let me = std::process::id() as i32;
    let mut victims: Vec<i32> = Vec::new();
    // the client hosts `add_clients` made, then the three of every lab
    let namespaces: Vec<String> = (2..=MAX_CLIENTS)
        .filter_map(|k| info.client_host(k).map(|h| h.ns))
        .chain(info.namespaces().iter().map(|n| n.to_string()))
        .collect();
    for ns in &namespaces {
        if exists_ns(ns) {
            victims.extend(crate::netns::pids(ns).into_iter().filter(|&p| p != me));
        }
    }
    victims.sort();
    victims.dedup();
    for &p in &victims {
        // SAFETY: sending SIGTERM to a pid that `ip netns pids` reported inside our lab.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while victims.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in &victims {
        if alive(p) {
            // SAFETY: as above; the process ignored SIGTERM.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    report.killed = victims;
    for ns in &namespaces {
        if exists_ns(ns) {
            ip(&["netns", "del", ns])?;
            report.namespaces.push(ns.to_string());
        }
    }
    // Interfaces created in the host namespace by an interrupted older build.
    for dev in [
        &info.cli_if,
        &info.emu_cli_if,
        &info.emu_srv_if,
        &info.srv_if,
    ] {
        if ip(&["link", "show", "dev", dev]).is_ok() {
            let _ = ip(&["link", "del", dev]);
        }
    }
    if info.runtime_dir.exists() {
        std::fs::remove_dir_all(&info.runtime_dir)
            .map_err(|e| LabError::Io(format!("{}: {e}", info.runtime_dir.display())))?;
    }
    Ok(report)
}

/// One lab on this host, as `mimic lab list` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct LabEntry {
    pub name: String,
    pub owner: Ownership,
    /// Its namespaces that exist (client hosts included).
    pub namespaces: Vec<String>,
    /// QEMU processes of its guests that run (role, pid).
    pub guests: Vec<(String, i32)>,
    /// Whether its runtime directory (`/run/mimic/NAME`) exists.
    pub runtime_dir: bool,
}

/// The lab a namespace name belongs to, if it is named like a lab host's (`NAME-cli`,
/// `NAME-emu`, `NAME-srv`, `NAME-cliK`).
fn lab_of_namespace(ns: &str) -> Option<&str> {
    let (name, host) = ns.rsplit_once('-')?;
    let client_k = host
        .strip_prefix("cli")
        .and_then(|k| k.parse::<u32>().ok())
        .is_some_and(|k| (2..=MAX_CLIENTS).contains(&k));
    (matches!(host, "cli" | "emu" | "srv") || client_k)
        .then_some(name)
        .filter(|n| validate_name(n).is_ok())
}

fn dir_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every lab on this host: the runtime directories under `/run/mimic` and the namespaces
/// named like a lab host's (a lab whose directory is gone still shows), by name.
pub fn list() -> Vec<LabEntry> {
    let mut names: Vec<String> = dir_names(Path::new("/run/mimic"))
        .into_iter()
        .filter(|n| validate_name(n).is_ok() && runtime_dir(n).is_dir())
        .chain(
            dir_names(Path::new("/run/netns"))
                .iter()
                .filter_map(|ns| lab_of_namespace(ns).map(String::from)),
        )
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| LabInfo::for_name(&n).ok())
        .map(|info| {
            let namespaces = (2..=MAX_CLIENTS)
                .filter_map(|k| info.client_host(k).map(|h| h.ns))
                .chain(info.namespaces().iter().map(|n| n.to_string()))
                .filter(|ns| exists_ns(ns))
                .collect();
            let guests = ["emu", "srv"]
                .iter()
                .filter_map(|role| {
                    crate::guest::load_record(&info.runtime_dir, role)
                        .filter(|r| crate::guest::alive(r.pid))
                        .map(|r| (role.to_string(), r.pid))
                })
                .collect();
            LabEntry {
                owner: ownership(&info),
                namespaces,
                guests,
                runtime_dir: info.runtime_dir.is_dir(),
                name: info.name,
            }
        })
        .collect()
}

/// A lab [`sweep`] took down (or, on a dry run, would).
#[derive(Clone, Debug, Serialize)]
pub struct Swept {
    pub lab: LabEntry,
    /// What `down` removed (None on a dry run or when it failed).
    pub down: Option<DownReport>,
    /// Why `down` failed (the other labs are swept all the same).
    pub error: Option<String>,
}

/// Takes down every lab whose owners have all exited ([`LabOptions::owner`]): what a test,
/// bench or replay killed before its own teardown left behind. Labs without an owner, or with
/// one that runs, are left alone. `dry_run`: only says which. A lab that cannot be taken down
/// is reported with its error, and the others are swept all the same.
pub fn sweep(dry_run: bool) -> Vec<Swept> {
    list()
        .into_iter()
        .filter(|lab| matches!(lab.owner, Ownership::Exited { .. }))
        .map(|lab| {
            let (down, error) = match dry_run {
                true => (None, None),
                false => match down(&lab.name) {
                    Ok(r) => (Some(r), None),
                    Err(e) => (None, Some(e.to_string())),
                },
            };
            Swept { lab, down, error }
        })
        .collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct InterfaceStatus {
    pub namespace: String,
    pub name: String,
    pub present: bool,
    pub up: bool,
    pub mac: Option<String>,
    pub addresses: Vec<String>,
    /// Offload features still on that should be off (empty when all is well).
    pub offloads_on: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LabStatus {
    pub name: String,
    /// All namespaces and interfaces present.
    pub up: bool,
    pub namespaces: Vec<(String, bool)>,
    pub interfaces: Vec<InterfaceStatus>,
    pub server_addr: Ipv4Addr,
    pub client_addr: Ipv4Addr,
    pub client_pool: IpNet,
    /// The server's TCP stack profile in force (read back), when the lab is up.
    pub stack: Option<StackProfile>,
    /// Pid of a `mimic netemu run --lab NAME` that is running, if any.
    pub netemu_pid: Option<i32>,
    /// The process the lab belongs to ([`LabOptions::owner`]).
    pub owner: Ownership,
    pub processes: Vec<i32>,
    /// Each host: namespace or guest, and its kernel.
    pub hosts: Vec<HostStatus>,
    pub info: LabInfo,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostStatus {
    pub role: String,
    pub namespace: String,
    /// `namespace` or `guest`.
    pub kind: String,
    /// `uname -r` on the host (None when it could not be asked: see `error`).
    pub kernel: Option<String>,
    pub error: Option<String>,
    pub guest: Option<crate::guest::GuestRecord>,
    pub guest_running: Option<bool>,
}

fn iface_status(ns: &str, dev: &str, end_host: bool) -> InterfaceStatus {
    let mut st = InterfaceStatus {
        namespace: ns.into(),
        name: dev.into(),
        present: false,
        up: false,
        mac: None,
        addresses: vec![],
        offloads_on: vec![],
    };
    if !exists_ns(ns) {
        return st;
    }
    let Ok(json) = ipn(ns, &format!("-j addr show dev {dev}")) else {
        return st;
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
    let Some(l) = v.get(0) else { return st };
    st.present = true;
    st.up = l
        .get("flags")
        .and_then(|f| f.as_array())
        .is_some_and(|f| f.iter().any(|x| x == "UP"));
    st.mac = l.get("address").and_then(|a| a.as_str()).map(String::from);
    if let Some(a) = l.get("addr_info").and_then(|a| a.as_array()) {
        st.addresses = a
            .iter()
            .filter_map(|x| {
                Some(format!(
                    "{}/{}",
                    x.get("local")?.as_str()?,
                    x.get("prefixlen")?.as_u64()?
                ))
            })
            .collect();
    }
    if let Ok(out) = run(crate::netns::command(ns, "ethtool", ["-k", dev])) {
        let mut want_off = vec![
            "tcp-segmentation-offload",
            "generic-segmentation-offload",
            "generic-receive-offload",
        ];
        if end_host {
            want_off.push("tx-checksumming");
        }
        for line in out.lines() {
            if let Some((k, v)) = line.split_once(':') {
                if want_off.contains(&k.trim()) && v.trim().starts_with("on") {
                    st.offloads_on.push(k.trim().to_string());
                }
            }
        }
    }
    st
}

/// What exists of the lab right now.
pub fn status(name: &str) -> Result<LabStatus, LabError> {
    let info = LabInfo::for_name(name)?;
    let mut namespaces: Vec<(String, bool)> = info
        .namespaces()
        .iter()
        .map(|n| (n.to_string(), exists_ns(n)))
        .collect();
    let mut interfaces = vec![
        iface_status(&info.ns_cli, &info.cli_if, true),
        iface_status(&info.ns_emu, &info.emu_cli_if, false),
        iface_status(&info.ns_emu, &info.emu_srv_if, false),
        iface_status(&info.ns_srv, &info.srv_if, true),
    ];
    // the client hosts `up --clients` added
    for h in (2..=MAX_CLIENTS).filter_map(|k| info.client_host(k)) {
        if exists_ns(&h.ns) {
            interfaces.push(iface_status(&h.ns, &h.iface, true));
            namespaces.push((h.ns, true));
        }
    }
    let up = namespaces.iter().all(|n| n.1) && interfaces.iter().all(|i| i.present);
    let stack = if up {
        stack::read_back(name).ok()
    } else {
        None
    };
    let netemu_pid = std::fs::read_to_string(info.runtime_dir.join("netemu.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&p| alive(p));
    let mut processes: Vec<i32> = info
        .namespaces()
        .iter()
        .filter(|n| exists_ns(n))
        .flat_map(|n| crate::netns::pids(n))
        .collect();
    processes.sort();
    processes.dedup();
    let mut hosts = Vec::new();
    for (role, ns) in [
        ("cli", &info.ns_cli),
        ("emu", &info.ns_emu),
        ("srv", &info.ns_srv),
    ] {
        let rec = crate::guest::load_record(&info.runtime_dir, role);
        let running = rec.as_ref().map(|r| crate::guest::alive(r.pid));
        let (kernel, error) = if !exists_ns(ns) {
            (None, Some("namespace missing".to_string()))
        } else {
            let h = match &rec {
                Some(r) => Host::Guest(Box::new(r.clone())),
                None => Host::Namespace(ns.clone()),
            };
            match host_kernel(&h) {
                Ok(k) => (Some(k), None),
                Err(e) => (None, Some(e.to_string())),
            }
        };
        hosts.push(HostStatus {
            role: role.into(),
            namespace: ns.clone(),
            kind: if rec.is_some() { "guest" } else { "namespace" }.into(),
            kernel,
            error,
            guest: rec,
            guest_running: running,
        });
    }
    let up = up && hosts.iter().all(|h| h.guest_running != Some(false));
    Ok(LabStatus {
        name: name.into(),
        up,
        namespaces,
        interfaces,
        server_addr: info.server_addr,
        client_addr: info.client_addr,
        client_pool: info.client_pool,
        stack,
        netemu_pid,
        owner: ownership(&info),
        processes,
        hosts,
        info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_its_pid_and_start_time_and_a_zombie_has_exited() {
        let me = Owner::current();
        assert!(me.running());
        assert_eq!(
            Owner::parse(&format!("{} {}\n", me.pid, me.start_ticks)),
            Some(me)
        );
        for bad in ["", "12", "x 1", "0 5", "-3 5", "1 2 3", "1 y"] {
            assert_eq!(Owner::parse(bad), None, "{bad:?}");
            assert_eq!(Owner::parse_all(bad), None, "{bad:?}");
        }
        assert_eq!(
            Owner::parse_all("7 70\n\n8 80\n"),
            Some(vec![
                Owner {
                    pid: 7,
                    start_ticks: 70
                },
                Owner {
                    pid: 8,
                    start_ticks: 80
                }
            ])
        );
        assert_eq!(Owner::parse_all("7 70\nnot one\n"), None);
        // the same pid started at another time is another process
        let other = Owner {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!other.running());
        assert!(Owner::of(i32::MAX).is_err());

        // a child that has exited but is not reaped yet (a zombie) no longer owns anything
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let owner = Owner::of(child.id() as i32).ok();
        let deadline = Instant::now() + Duration::from_secs(10);
        while process::running(child.id() as i32) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(o) = owner {
            assert!(!o.running(), "a zombie counts as exited");
        }
        assert!(Owner::of(child.id() as i32).is_err());
        child.wait().unwrap();
    }

    #[test]
    fn namespaces_are_traced_to_their_lab() {
        assert_eq!(lab_of_namespace("rp123x4-cli"), Some("rp123x4"));
        assert_eq!(lab_of_namespace("a-b-emu"), Some("a-b"));
        assert_eq!(lab_of_namespace("lab-srv"), Some("lab"));
        assert_eq!(lab_of_namespace("lab-cli2"), Some("lab"));
        assert_eq!(lab_of_namespace("lab-cli8"), Some("lab"));
        for no in [
            "lab-cli9", "lab-cli1", "lab-cli0", "lab-web", "lab", "-cli", "9lab-cli",
        ] {
            assert_eq!(lab_of_namespace(no), None, "{no}");
        }
    }

    #[test]
    fn names_are_checked_and_interface_names_fit() {
        let i = LabInfo::for_name("abcdefghijkl").unwrap();
        assert!(i.emu_cli_if.len() <= 15 && i.emu_srv_if.len() <= 15);
        assert!(LabInfo::for_name("abcdefghijklm")
            .unwrap_err()
            .to_string()
            .contains("at most 12"));
        assert!(LabInfo::for_name("a/b").is_err());
        assert!(LabInfo::for_name("1lab").is_err());
        assert!(LabInfo::for_name("").is_err());
    }

    #[test]
    fn client_hosts_have_their_own_addresses_pools_and_names() {
        let i = LabInfo::for_name("abcdefghijkl").unwrap();
        let h1 = i.client_host(1).unwrap();
        assert_eq!(
            (h1.ns.as_str(), h1.iface.as_str()),
            ("abcdefghijkl-cli", "abcdefghijkl-c")
        );
        assert_eq!(h1.addr, CLIENT_ADDR);
        assert_eq!(h1.pool, i.client_pool);
        let h2 = i.client_host_named("cli2").unwrap();
        assert_eq!(h2.ns, "abcdefghijkl-cli2");
        assert_eq!(h2.addr, Ipv4Addr::new(198, 18, 0, 3));
        assert_eq!(h2.pool.to_string(), "198.19.32.0/19");
        let last = i.client_host(MAX_CLIENTS).unwrap();
        assert_eq!(last.pool.to_string(), "198.19.224.0/19");
        for k in 1..=MAX_CLIENTS {
            let h = i.client_host(k).unwrap();
            assert!(h.iface.len() <= 15 && h.switch_port.len() <= 15, "{h:?}");
            assert_eq!(i.client_host_named(&h.role), Some(h));
        }
        assert!(i.switch().0.len() <= 15 && i.switch().1.len() <= 15);
        assert_eq!(i.client_host(0), None);
        assert_eq!(i.client_host(MAX_CLIENTS + 1), None);
        for bad in [
            "cli1", "cli0", "srv", "cli9", "clix", "cli02", "cli002", "cli+2",
        ] {
            assert_eq!(i.client_host_named(bad), None, "{bad}");
        }
    }

    #[test]
    fn pool_has_at_least_4096_addresses() {
        let i = LabInfo::for_name("x").unwrap();
        assert!(i.pool_len() >= 4096);
        assert_eq!(i.pool_addr(0), Some(Ipv4Addr::new(198, 19, 0, 1)));
        assert_eq!(
            i.pool_addr(i.pool_len() - 1),
            Some(Ipv4Addr::new(198, 19, 31, 254))
        );
        assert_eq!(i.pool_addr(i.pool_len()), None);
        assert!(i.client_pool.contains(i.pool_addr(5000).unwrap().into()));
    }
}
