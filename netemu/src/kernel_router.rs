//! A router with kernel pipes (`mimic netemu run --backend netem`): no datapath of mimic's;
//! the control channel's `install_pipes` / `remove_pipes` requests carry [`FlowRule`]s, which
//! this router renders itself into `tc` lines ([`SlotPipes`]) and applies with `tc -batch` on
//! its own interfaces. The router, not the controller, renders: it alone knows its interfaces,
//! what it installed and which class numbers are free, and the controller never sends shell
//! text to run as root.
//!
//! Layout ([`SlotPipes`]): each interface gets mimic's root htb qdisc ([`TC_HANDLE`], default
//! class `6d69:1` unshaped) and a 256-bucket u32 hash table keyed on the last octet of the
//! client address, as `mimic netemu render --backend netem` renders. A connection takes a
//! *slot*: slot `s` is class `G:K` (an htb class and its netem leaf, handle `0x1000 + s`) in
//! group `g = s / 256`, an htb qdisc `G:` (`G = 0x100 + g`) below root class `6d69:G`, so no
//! qdisc ever holds more than 256 classes (adding a class costs time linear in its qdisc's
//! classes). Two u32 filters per pipe, each with a handle of its own (`100:BUCKET:NODE`), send a
//! packet to its group and, inside the group, to its class. Removing a connection deletes its
//! filters and classes (their leaves go with them) and frees the slot for the next one; the
//! groups stay. [`MAX_SLOTS`] connections at once at most.
//!
//! Only what mimic installed is touched: the root qdisc is refused when it is not the
//! kernel's default or mimic's unless `force`, and [`KernelRouter::teardown`] (on `teardown`,
//! `shutdown`, SIGINT/SIGTERM, or drop) deletes mimic's root qdisc and nothing else.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::{PipeConfig, QueueLimit};
use crate::engine::FlowRule;
use crate::render::{self, tc_rate, ApplyOptions, Leaf, RenderError, RootQdisc, TC_HANDLE};

/// The lines a `tc -batch` run says failed (re-exported: the replay's kernel pipes read them).
pub use crate::render::batch_failures;

/// Connections (pipe pairs) a router holds at once at most.
pub const MAX_SLOTS: usize = 16_384;
/// Classes per group qdisc.
pub const SLOT_GROUP: usize = 256;
/// Major number of group 0's qdisc (group `g` is `0x100 + g`).
const GROUP_BASE: u32 = 0x100;
/// Handle of slot 0's netem leaf (slot `s` is `0x1000 + s`; the last, 0x4fff, stays below
/// mimic's root 0x6d69).
const LEAF_BASE: u32 = 0x1000;
/// The u32 hash table of flow filters (in the root and in each group).
const FLOW_HT: u32 = 0x100;
/// u32 node ids in one bucket: 12 bits, 0 is not one.
const MAX_NODE: u32 = 0xfff;

/// A pipe pair the router installed (the controller's handle for removing it).
pub type PipeId = u64;

/// One u32 filter of a pipe: interface (0 server side, 1 client side), the qdisc it is on, the
/// bucket and node of its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FilterRef {
    dev: usize,
    qdisc: u32,
    bucket: u8,
    node: u32,
}

#[derive(Clone, Debug)]
struct Installed {
    slot: usize,
    filters: Vec<FilterRef>,
}

/// The slot layout of kernel pipes on two interfaces: pure, it only writes `tc -batch` lines
/// (without the leading `tc`) and keeps track of slots and filter handles.
#[derive(Debug)]
pub struct SlotPipes {
    /// Server-side (upstream pipes) and client-side (downstream pipes) interface.
    devs: [String; 2],
    free: BTreeSet<usize>,
    groups: BTreeSet<usize>,
    nodes: HashMap<(usize, u32, u8), BTreeSet<u32>>,
    pipes: HashMap<PipeId, Installed>,
    next_id: PipeId,
    /// Connections whose ACK policy (delayed-ACK shaping) was left out: netem cannot thin ACKs.
    pub ack_left_out: u64,
}

impl SlotPipes {
    pub fn new(client_if: &str, server_if: &str) -> SlotPipes {
        SlotPipes {
            devs: [server_if.to_string(), client_if.to_string()],
            free: (0..MAX_SLOTS).collect(),
            groups: BTreeSet::new(),
            nodes: HashMap::new(),
            pipes: HashMap::new(),
            next_id: 1,
            ack_left_out: 0,
        }
    }

    /// Connections installed now.
    pub fn len(&self) -> usize {
        self.pipes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pipes.is_empty()
    }

    /// The root qdiscs, catch-all classes and root hash tables of both interfaces.
    pub fn skeleton(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (i, dev) in self.devs.iter().enumerate() {
            v.push(format!(
                "qdisc add dev {dev} root handle {TC_HANDLE} stab overhead -14 htb default 1"
            ));
            v.push(format!(
                "class add dev {dev} parent {TC_HANDLE} classid {TC_HANDLE}1 htb rate {r} ceil {r} quantum 1514",
                r = tc_rate(0)
            ));
            v.extend(render::flow_hash_table(dev, TC_HANDLE, i == 0));
        }
        v
    }

    /// The lines that remove everything mimic installed.
    pub fn teardown(&self) -> Vec<String> {
        self.devs
            .iter()
            .map(|dev| format!("qdisc del dev {dev} root handle {TC_HANDLE}"))
            .collect()
    }

    fn alloc_node(&mut self, dev: usize, qdisc: u32, bucket: u8) -> Result<u32, RenderError> {
        let used = self.nodes.entry((dev, qdisc, bucket)).or_default();
        let node = (1..=MAX_NODE).find(|n| !used.contains(n)).ok_or_else(|| {
            RenderError::Invalid(format!(
                "more than {MAX_NODE} connections at once whose client addresses end in .{bucket}: the u32 hash bucket is full"
            ))
        })?;
        used.insert(node);
        Ok(node)
    }

    fn free_node(&mut self, f: &FilterRef) {
        if let Some(s) = self.nodes.get_mut(&(f.dev, f.qdisc, f.bucket)) {
            s.remove(&f.node);
        }
    }

    /// Installs `rules` (one pipe pair each): their ids, in order, and the lines. All or none:
    /// on an error nothing is kept.
    pub fn install(
        &mut self,
        rules: &[FlowRule],
    ) -> Result<(Vec<PipeId>, Vec<String>), RenderError> {
        if rules.len() > self.free.len() {
            return Err(RenderError::TooMany {
                backend: "kernel pipes at once on this router",
                n: self.pipes.len() + rules.len(),
                max: MAX_SLOTS,
            });
        }
        let mut lines = Vec::new();
        let mut ids = Vec::with_capacity(rules.len());
        let mut done: Vec<PipeId> = Vec::new();
        let mut new_groups = Vec::new();
        for r in rules {
            match self.install_one(r, &mut lines, &mut new_groups) {
                Ok(id) => {
                    ids.push(id);
                    done.push(id);
                }
                Err(e) => {
                    for id in done {
                        self.forget(id);
                    }
                    for g in new_groups {
                        self.groups.remove(&g);
                    }
                    return Err(e);
                }
            }
        }
        Ok((ids, lines))
    }

    fn install_one(
        &mut self,
        r: &FlowRule,
        lines: &mut Vec<String>,
        new_groups: &mut Vec<usize>,
    ) -> Result<PipeId, RenderError> {
        let (IpAddr::V4(client), IpAddr::V4(_)) = (r.client.ip(), r.server.ip()) else {
            return Err(RenderError::Invalid(format!(
                "{} -> {}: kernel pipes on a router take IPv4 flows only",
                r.client, r.server
            )));
        };
        let what = format!("{} -> {}", r.client, r.server);
        let up = pipe_args(&r.up, &format!("{what} up"))?;
        let down = pipe_args(&r.down, &format!("{what} down"))?;
        if r.up.ack.is_some() || r.down.ack.is_some() {
            self.ack_left_out += 1;
        }
        let slot = *self.free.iter().next().expect("checked free slots");
        let g = slot / SLOT_GROUP;
        let gm = GROUP_BASE + g as u32;
        let k = (slot % SLOT_GROUP) as u32 + 1;
        let leaf = LEAF_BASE + slot as u32;
        let bucket = client.octets()[3];
        let mut filters = Vec::with_capacity(4);
        let nodes: Result<Vec<FilterRef>, RenderError> = (0..2)
            .flat_map(|dev| [(dev, render::TC_MAJOR), (dev, gm)])
            .map(|(dev, qdisc)| {
                self.alloc_node(dev, qdisc, bucket).map(|node| FilterRef {
                    dev,
                    qdisc,
                    bucket,
                    node,
                })
            })
            .collect();
        let nodes = match nodes {
            Ok(n) => n,
            Err(e) => {
                // give back the nodes of this pipe taken before the bucket filled
                let taken: Vec<FilterRef> = self
                    .nodes
                    .iter()
                    .filter(|((_, _, b), _)| *b == bucket)
                    .flat_map(|(&(dev, qdisc, bucket), s)| {
                        s.iter().map(move |&node| FilterRef {
                            dev,
                            qdisc,
                            bucket,
                            node,
                        })
                    })
                    .filter(|f| !self.pipes.values().any(|p| p.filters.contains(f)))
                    .collect();
                for f in taken {
                    self.free_node(&f);
                }
                return Err(e);
            }
        };
        let group_is_new = self.groups.insert(g);
        if group_is_new {
            new_groups.push(g);
        }
        for (dev_i, args) in [&up, &down].into_iter().enumerate() {
            let dev = &self.devs[dev_i];
            let upstream = dev_i == 0;
            if group_is_new {
                lines.push(format!(
                    "class add dev {dev} parent {TC_HANDLE} classid {TC_HANDLE}{gm:x} htb rate {r} ceil {r} quantum 1514",
                    r = tc_rate(0)
                ));
                lines.push(format!(
                    "qdisc add dev {dev} parent {TC_HANDLE}{gm:x} handle {gm:x}: htb"
                ));
                lines.extend(render::flow_hash_table(dev, &format!("{gm:x}:"), upstream));
            }
            lines.push(format!(
                "class add dev {dev} parent {gm:x}: classid {gm:x}:{k:x} htb {}",
                args.0
            ));
            lines.push(format!(
                "qdisc add dev {dev} parent {gm:x}:{k:x} handle {leaf:x}: {}",
                args.1
            ));
            // the client is the source upstream, the destination downstream
            let (src, dst) = if upstream {
                (r.client, r.server)
            } else {
                (r.server, r.client)
            };
            let root_f = nodes[dev_i * 2];
            let group_f = nodes[dev_i * 2 + 1];
            lines.push(filter_line(
                dev,
                TC_HANDLE,
                &root_f,
                src,
                dst,
                &format!("{TC_HANDLE}{gm:x}"),
            ));
            lines.push(filter_line(
                dev,
                &format!("{gm:x}:"),
                &group_f,
                src,
                dst,
                &format!("{gm:x}:{k:x}"),
            ));
            filters.push(root_f);
            filters.push(group_f);
        }
        self.free.remove(&slot);
        let id = self.next_id;
        self.next_id += 1;
        self.pipes.insert(id, Installed { slot, filters });
        Ok(id)
    }

    /// Frees a pipe's slot and filter handles without writing lines.
    fn forget(&mut self, id: PipeId) -> Option<Installed> {
        let p = self.pipes.remove(&id)?;
        for f in &p.filters {
            self.free_node(f);
        }
        self.free.insert(p.slot);
        Some(p)
    }

    /// Removes pipes: the lines, and how many of `ids` were installed (unknown ids are left
    /// alone).
    pub fn remove(&mut self, ids: &[PipeId]) -> (Vec<String>, usize) {
        let mut lines = Vec::new();
        let mut n = 0;
        for &id in ids {
            let Some(p) = self.forget(id) else { continue };
            n += 1;
            let g = p.slot / SLOT_GROUP;
            let gm = GROUP_BASE + g as u32;
            let k = (p.slot % SLOT_GROUP) as u32 + 1;
            for f in &p.filters {
                let parent = if f.qdisc == render::TC_MAJOR {
                    TC_HANDLE.to_string()
                } else {
                    format!("{:x}:", f.qdisc)
                };
                lines.push(format!(
                    "filter del dev {} parent {parent} prio 1 handle {FLOW_HT:x}:{:x}:{:x} protocol ip u32",
                    self.devs[f.dev], f.bucket, f.node
                ));
            }
            for dev in &self.devs {
                lines.push(format!("class del dev {dev} classid {gm:x}:{k:x}"));
            }
        }
        (lines, n)
    }
}

fn filter_line(
    dev: &str,
    parent: &str,
    f: &FilterRef,
    src: SocketAddr,
    dst: SocketAddr,
    to: &str,
) -> String {
    format!(
        "filter add dev {dev} parent {parent} prio 1 handle {ht:x}:{b:x}:{n:x} protocol ip u32 ht {ht:x}:{b:x}: match ip protocol 6 0xff match ip src {}/32 match ip dst {}/32 match ip sport {} 0xffff match ip dport {} 0xffff flowid {to}",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port(),
        ht = FLOW_HT,
        b = f.bucket,
        n = f.node,
    )
}

/// A pipe's htb class arguments and netem leaf arguments (after `htb ` / the leaf handle).
fn pipe_args(c: &PipeConfig, what: &str) -> Result<(String, String), RenderError> {
    let limit = match c.queue {
        QueueLimit::Packets(n) => render::netem_limit(c, n),
        QueueLimit::Bytes(_) => {
            return Err(RenderError::Unsupported {
                what: what.into(),
                why: "netem has no byte queue limit; give the queue in packets".into(),
            })
        }
    };
    Ok(render::pipe_args(c, Leaf::Netem, limit))
}

/// A line no batch of mimic's contains, which always fails (no interface has that name; tc
/// returns from it, it does not exit): after a batch, its `Command failed -:N` says tc has
/// done every line before it.
const SENTINEL: &str = "qdisc del dev mimic.sentinel root";
/// How long one batch of a [`TcSession`] may take.
const SESSION_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One `tc -force -batch -` kept running for the router's life, fed its lines over standard
/// input: no `tc` exec per batch (a process start costs tens of milliseconds on a small router
/// and more in a TCG guest). tc reads a line and runs it before reading the next, and reports
/// each failing line on standard error as `Command failed -:N`; a [`SENTINEL`] line after each
/// batch marks where the batch ends, so the failures of each batch, and only those, are known.
pub struct TcSession {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stderr: std::sync::mpsc::Receiver<String>,
    /// Lines sent so far (tc's line number of the last one).
    sent: usize,
}

impl TcSession {
    /// Starts `tc -force -batch -` (`tc` from PATH, in this network namespace).
    pub fn start() -> Result<TcSession, RenderError> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new("tc")
            .args(["-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|_| RenderError::NoTool("tc (iproute2)".into()))?;
        let stdin = child.stdin.take().expect("piped");
        let err = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("tc-session".into())
            .spawn(move || {
                for l in std::io::BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| RenderError::Apply {
                cmd: "tc -force -batch -".into(),
                err: e.to_string(),
            })?;
        Ok(TcSession {
            child,
            stdin,
            stderr: rx,
            sent: 0,
        })
    }

    /// Runs `lines`; the ones that failed (0-based in `lines`) with tc's message. An error
    /// when tc is gone or does not finish the batch within two minutes (the session is then
    /// of no further use).
    pub fn run(&mut self, lines: &[String]) -> Result<Vec<(usize, String)>, RenderError> {
        use std::io::Write;
        let gone = |why: String| RenderError::Apply {
            cmd: "tc -force -batch -".into(),
            err: why,
        };
        let first = self.sent + 1;
        let mut text = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum::<usize>() + 40);
        for l in lines {
            debug_assert!(!l.contains('\n'));
            text.push_str(l);
            text.push('\n');
        }
        text.push_str(SENTINEL);
        text.push('\n');
        self.sent += lines.len() + 1;
        let sentinel = self.sent;
        self.stdin
            .write_all(text.as_bytes())
            .and_then(|_| self.stdin.flush())
            .map_err(|e| gone(format!("writing to tc: {e}")))?;
        let deadline = Instant::now() + SESSION_LIMIT;
        let mut failed = Vec::new();
        let mut why: Vec<String> = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = match self.stderr.recv_timeout(left) {
                Ok(l) => l,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    return Err(gone(format!(
                        "no end of the batch within {} s",
                        SESSION_LIMIT.as_secs()
                    )))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(gone(format!(
                        "tc exited ({})",
                        self.child
                            .try_wait()
                            .ok()
                            .flatten()
                            .map(|s| s.to_string())
                            .unwrap_or_else(|| "still running, its stderr closed".into())
                    )))
                }
            };
            match batch_failures(&format!("{}\n{l}", why.join("\n"))).pop() {
                Some((n, msg)) => {
                    why.clear();
                    if n == sentinel {
                        return Ok(failed);
                    }
                    if (first..sentinel).contains(&n) {
                        failed.push((n - first, msg));
                    }
                }
                None => why.push(l),
            }
        }
    }
}

impl Drop for TcSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `lines` with one `tc -batch -` (`-force`: on past a failing line, for removals whose
/// objects may be gone already). An error names the failing line.
pub fn tc_batch(lines: &[String], force: bool) -> Result<(), RenderError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut text = lines.join("\n");
    text.push('\n');
    render::tc_batch_with(&text, &ApplyOptions::default(), force)
}

/// What a kernel router reports (`kernel_info`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelRouterInfo {
    /// `netem`.
    pub backend: String,
    /// `uname -r` of the router.
    pub kernel: String,
    pub client_if: String,
    pub server_if: String,
    /// Connections (pipe pairs) installed now.
    pub installed: usize,
    /// The most connections at once.
    pub max_slots: usize,
    /// Connections installed / removed since the router started.
    pub installs: u64,
    pub removes: u64,
    /// `tc -batch` runs, and the longest one (ms).
    pub batches: u64,
    pub max_batch_ms: f64,
    /// Connections whose delayed-ACK shaping was left out.
    pub ack_left_out: u64,
    /// Whether a foreign root qdisc was replaced (`--force`).
    pub forced: bool,
}

/// The router's state: the slots, and whether mimic's root qdiscs are installed.
pub struct KernelRouter {
    slots: SlotPipes,
    installed: bool,
    kernel: String,
    installs: u64,
    removes: u64,
    batches: u64,
    max_batch_ms: f64,
    forced: bool,
    /// The `tc -force -batch -` every batch goes to (started on the first; a new one after
    /// one that failed).
    tc: Option<TcSession>,
}

impl KernelRouter {
    /// Checks that the interfaces are two ([`render::check_interfaces`]), that this kernel has
    /// netem and that both interfaces exist with the kernel's default root qdisc or mimic's (a
    /// previous installation, replaced; another only with `force`), then installs the
    /// skeleton.
    pub fn open(
        client_if: &str,
        server_if: &str,
        force: bool,
    ) -> Result<KernelRouter, RenderError> {
        render::check_interfaces(&render::RenderOptions::new(client_if, server_if))?;
        let opts = ApplyOptions {
            force,
            ..ApplyOptions::default()
        };
        let roots = render::roots_to_replace([server_if, client_if], &opts, true)?;
        let mut forced = false;
        let mut clear = Vec::new();
        for (dev, r) in roots {
            match r {
                RootQdisc::KernelDefault(_) => {}
                RootQdisc::Mimic => {
                    clear.push(format!("qdisc del dev {dev} root handle {TC_HANDLE}"))
                }
                RootQdisc::Other { .. } => {
                    forced = true;
                    clear.push(format!("qdisc del dev {dev} root"));
                }
            }
        }
        tc_batch(&clear, false)?;
        let slots = SlotPipes::new(client_if, server_if);
        let mut r = KernelRouter {
            slots,
            installed: true,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            installs: 0,
            removes: 0,
            batches: 0,
            max_batch_ms: 0.0,
            forced,
            tc: None,
        };
        let sk = r.slots.skeleton();
        if let Err(e) = r.run(&sk) {
            let _ = r.teardown();
            return Err(e);
        }
        Ok(r)
    }

    /// Runs `lines` in the router's [`TcSession`] (every line is tried; removals whose
    /// objects are gone already fail alone); an error names the first line that failed.
    fn run(&mut self, lines: &[String]) -> Result<(), RenderError> {
        if lines.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let tc = match &mut self.tc {
            Some(tc) => tc,
            None => self.tc.insert(TcSession::start()?),
        };
        let r = tc.run(lines);
        self.batches += 1;
        self.max_batch_ms = self.max_batch_ms.max(t.elapsed().as_secs_f64() * 1e3);
        match r {
            Ok(failed) => match failed.first() {
                None => Ok(()),
                Some((i, why)) => Err(RenderError::Apply {
                    cmd: format!("tc {}", lines[*i]),
                    err: why.clone(),
                }),
            },
            Err(e) => {
                self.tc = None;
                Err(e)
            }
        }
    }

    /// Installs the pipes of `rules` in one batch (all or none); their ids.
    pub fn install(&mut self, rules: &[FlowRule]) -> Result<Vec<PipeId>, RenderError> {
        if !self.installed {
            return Err(RenderError::Invalid(
                "the router's pipes were torn down; restart `mimic netemu run --backend netem`"
                    .into(),
            ));
        }
        let (ids, lines) = self.slots.install(rules)?;
        if let Err(e) = self.run(&lines) {
            // what of the batch got installed goes again
            let (undo, _) = self.slots.remove(&ids);
            let _ = self.run(&undo);
            return Err(e);
        }
        self.installs += ids.len() as u64;
        Ok(ids)
    }

    /// Removes pipes; how many of `ids` were installed.
    pub fn remove(&mut self, ids: &[PipeId]) -> Result<usize, RenderError> {
        let (lines, n) = self.slots.remove(ids);
        self.run(&lines)?;
        self.removes += n as u64;
        Ok(n)
    }

    /// Removes mimic's root qdiscs (and with them every pipe); idempotent.
    pub fn teardown(&mut self) -> Result<(), RenderError> {
        if !self.installed {
            return Ok(());
        }
        self.installed = false;
        let lines = self.slots.teardown();
        let ack_left_out = self.slots.ack_left_out;
        self.slots = SlotPipes::new(&self.slots.devs[1], &self.slots.devs[0]);
        // (the count is of the router's whole run)
        self.slots.ack_left_out = ack_left_out;
        let r = self.run(&lines);
        self.tc = None;
        r
    }

    pub fn info(&self) -> KernelRouterInfo {
        KernelRouterInfo {
            backend: "netem".into(),
            kernel: self.kernel.clone(),
            client_if: self.slots.devs[1].clone(),
            server_if: self.slots.devs[0].clone(),
            installed: self.slots.len(),
            max_slots: MAX_SLOTS,
            installs: self.installs,
            removes: self.removes,
            batches: self.batches,
            max_batch_ms: self.max_batch_ms,
            ack_left_out: self.slots.ack_left_out,
            forced: self.forced,
        }
    }
}

impl Drop for KernelRouter {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("removing the router's kernel pipes: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(client: &str, port: u16) -> FlowRule {
        FlowRule {
            client: SocketAddr::new(client.parse().unwrap(), port),
            server: "198.18.1.2:80".parse().unwrap(),
            up: "delay=10ms,queue=10".parse().unwrap(),
            down: "delay=10ms,rate=2mbit,loss=0.01".parse().unwrap(),
        }
    }

    /// `netemu run --backend netem` on one interface for both sides: refused before tc runs
    /// (the second side's root qdisc would replace the first's). No machine has the name.
    #[test]
    fn one_interface_for_both_sides_is_refused() {
        let e = KernelRouter::open("mimic-t0", "mimic-t0", false)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("mimic-t0: given as both the client-side and the server-side interface"),
            "{e}"
        );
    }

    #[test]
    fn a_connection_gets_a_class_a_leaf_and_two_filters_per_interface() {
        let mut s = SlotPipes::new("cli0", "srv0");
        let sk = s.skeleton();
        assert!(sk[0]
            .starts_with("qdisc add dev srv0 root handle 6d69: stab overhead -14 htb default 1"));
        assert_eq!(sk.len(), 8);
        let (ids, lines) = s.install(&[rule("198.19.0.5", 1000)]).unwrap();
        assert_eq!(ids, [1]);
        // group 0 created on both interfaces (4 lines each), then class, leaf, 2 filters each
        assert_eq!(lines.len(), 16, "{lines:#?}");
        assert_eq!(
            lines[0],
            "class add dev srv0 parent 6d69: classid 6d69:100 htb rate 10gbit ceil 10gbit quantum 1514"
        );
        assert_eq!(
            lines[1],
            "qdisc add dev srv0 parent 6d69:100 handle 100: htb"
        );
        assert_eq!(
            lines[4],
            "class add dev srv0 parent 100: classid 100:1 htb rate 10gbit ceil 10gbit quantum 1514"
        );
        // upstream netem limit counts the delay line of an unlimited pipe
        assert!(lines[5].starts_with("qdisc add dev srv0 parent 100:1 handle 1000: netem limit "));
        assert!(lines[5].ends_with(" delay 10ms"), "{}", lines[5]);
        assert_eq!(
            lines[6],
            "filter add dev srv0 parent 6d69: prio 1 handle 100:5:1 protocol ip u32 ht 100:5: match ip protocol 6 0xff match ip src 198.19.0.5/32 match ip dst 198.18.1.2/32 match ip sport 1000 0xffff match ip dport 80 0xffff flowid 6d69:100"
        );
        assert!(
            lines[7].contains("parent 100: prio 1 handle 100:5:1 ")
                && lines[7].ends_with("flowid 100:1")
        );
        // downstream: server is the source, on the client-side interface, with rate and loss;
        // a store-and-forward pipe's rate is netem's own under an unlimited class, as in the
        // rendered script (render::pipe_args)
        assert_eq!(
            lines[12],
            "class add dev cli0 parent 100: classid 100:1 htb rate 10gbit ceil 10gbit quantum 1514"
        );
        assert!(
            lines[13].ends_with("delay 10ms rate 2mbit loss random 1%"),
            "{}",
            lines[13]
        );
        assert!(lines[14].contains("match ip src 198.18.1.2/32 match ip dst 198.19.0.5/32"));
    }

    #[test]
    fn removal_frees_the_slot_and_handles_for_the_next_connection() {
        let mut s = SlotPipes::new("cli0", "srv0");
        let (a, _) = s
            .install(&[rule("198.19.0.5", 1000), rule("198.19.0.5", 1001)])
            .unwrap();
        assert_eq!(s.len(), 2);
        let (_, l2) = s.install(&[rule("198.19.0.5", 1002)]).unwrap();
        // no group lines the second time; the third connection is slot 2, node 3
        assert_eq!(l2.len(), 8);
        assert!(l2[0].contains("classid 100:3 "));
        assert!(l2[2].contains("handle 100:5:3 "));
        let (del, n) = s.remove(&[a[0], 999]);
        assert_eq!(n, 1, "an unknown id is not counted");
        assert_eq!(
            del[0],
            "filter del dev srv0 parent 6d69: prio 1 handle 100:5:1 protocol ip u32"
        );
        assert_eq!(del.len(), 6);
        assert_eq!(del[4], "class del dev srv0 classid 100:1");
        assert_eq!(del[5], "class del dev cli0 classid 100:1");
        let (_, l3) = s.install(&[rule("198.19.0.9", 2000)]).unwrap();
        assert!(
            l3[0].contains("classid 100:1 "),
            "slot 0 is reused: {}",
            l3[0]
        );
        assert!(l3[2].contains("handle 100:9:1 "));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn slots_past_one_group_open_the_next_group() {
        let mut s = SlotPipes::new("c", "s");
        let rules: Vec<FlowRule> = (0..SLOT_GROUP as u16 + 1)
            .map(|p| rule("198.19.0.7", 1000 + p))
            .collect();
        let (ids, lines) = s.install(&rules).unwrap();
        assert_eq!(ids.len(), SLOT_GROUP + 1);
        assert!(lines
            .iter()
            .any(|l| l == "qdisc add dev s parent 6d69:101 handle 101: htb"));
        assert!(
            lines.iter().any(|l| l.contains("handle 10ff: netem")),
            "slot 255's leaf"
        );
        assert!(lines.iter().any(|l| l.contains("classid 101:1 ")));
        assert!(lines.iter().any(|l| l.contains("handle 1100: netem")));
        // every filter handle of one qdisc and bucket is distinct
        let mut seen = std::collections::HashSet::new();
        for l in lines
            .iter()
            .filter(|l| l.starts_with("filter add") && l.contains(" ht 100:7:"))
        {
            let dev_parent_handle: Vec<&str> = l.split(' ').take(10).collect();
            assert!(seen.insert(dev_parent_handle.join(" ")), "duplicate: {l}");
        }
    }

    /// A long replay: 70,000 connections through the slots, at most 500 at once, never run
    /// out of slots or filter handles; the router's limit is a clear error.
    #[test]
    fn a_long_replay_cycles_through_slots_and_the_limit_is_an_error() {
        let mut s = SlotPipes::new("c", "s");
        let mut open = std::collections::VecDeque::new();
        for i in 0..70_000u32 {
            let client = format!("198.19.{}.{}", (i / 250) % 250, i % 250 + 1);
            let (ids, _) = s
                .install(&[rule(&client, 1024 + (i % 60_000) as u16)])
                .unwrap();
            open.push_back(ids[0]);
            if open.len() > 500 {
                let (_, n) = s.remove(&[open.pop_front().unwrap()]);
                assert_eq!(n, 1);
            }
        }
        assert_eq!(s.len(), 500);
        assert!(
            s.groups.len() <= 3,
            "slots are reused: {} groups",
            s.groups.len()
        );
        let mut full = SlotPipes::new("c", "s");
        let rules: Vec<FlowRule> = (0..MAX_SLOTS as u32)
            .map(|i| rule(&format!("198.19.{}.{}", i / 200, i % 200 + 1), 2000))
            .collect();
        full.install(&rules).unwrap();
        let e = full.install(&[rule("198.19.250.1", 1)]).unwrap_err();
        assert!(e.to_string().contains("at most 16384"), "{e}");
        // one u32 bucket (one client address) takes 4,095 connections at once
        let mut one = SlotPipes::new("c", "s");
        let same: Vec<FlowRule> = (0..MAX_NODE as u16)
            .map(|p| rule("198.19.0.9", 1 + p))
            .collect();
        one.install(&same).unwrap();
        let e = one.install(&[rule("198.19.0.9", 9999)]).unwrap_err();
        assert!(e.to_string().contains("end in .9"), "{e}");
        assert_eq!(
            one.len(),
            MAX_NODE as usize,
            "nothing kept of the refused one"
        );
        one.install(&[rule("198.19.0.10", 1)]).unwrap();
    }

    #[test]
    fn a_batch_s_failures_are_read_from_tc_s_stderr() {
        let e = "Cannot find device \"nosuch0\"\nCommand failed -:2\nRTNETLINK answers: File exists\nWarning: ignored\nCommand failed /tmp/b.tc:7\n";
        assert_eq!(
            batch_failures(e),
            [
                (2, "Cannot find device \"nosuch0\"".to_string()),
                (7, "RTNETLINK answers: File exists".to_string())
            ]
        );
        assert!(batch_failures("").is_empty());
    }

    /// The persistent `tc -force -batch -` of a kernel router, on this machine's loopback
    /// (read-only lines and deletions of what does not exist): each batch gets its own
    /// failures, counted from its first line, and the session goes on after a failing line.
    #[test]
    fn a_tc_session_reports_each_batch_s_own_failed_lines() {
        if !std::process::Command::new("tc")
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            panic!("this test needs tc (iproute2) on PATH");
        }
        let mut tc = TcSession::start().unwrap();
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(tc.run(&l(&["qdisc show dev lo"])).unwrap().is_empty());
        let f = tc
            .run(&l(&[
                "qdisc show dev lo",
                "qdisc del dev mimic-nosuch0 root",
                "class show dev lo",
            ]))
            .unwrap();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, 1, "the second line of this batch");
        assert!(f[0].1.contains("mimic-nosuch0"), "{f:?}");
        let f = tc
            .run(&l(&[
                "qdisc del dev mimic-nosuch1 root",
                "qdisc show dev lo",
                "qdisc del dev mimic-nosuch2 root",
            ]))
            .unwrap();
        assert_eq!(
            f.iter().map(|x| x.0).collect::<Vec<_>>(),
            [0, 2],
            "counted from this batch's first line: {f:?}"
        );
        assert!(tc.run(&[]).unwrap().is_empty());
    }

    #[test]
    fn what_netem_cannot_take_is_refused_and_nothing_is_kept() {
        let mut s = SlotPipes::new("c", "s");
        let mut bad = rule("198.19.0.5", 1000);
        bad.up = "delay=1ms,queue=3000b".parse().unwrap();
        let e = s.install(&[rule("198.19.0.5", 999), bad]).unwrap_err();
        assert!(e.to_string().contains("byte queue"), "{e}");
        assert_eq!(s.len(), 0, "all or none");
        let mut v6 = rule("198.19.0.5", 1000);
        v6.client = "[2001:db8::1]:1000".parse().unwrap();
        assert!(s.install(&[v6]).unwrap_err().to_string().contains("IPv4"));
        let (_, l) = s.install(&[rule("198.19.0.5", 999)]).unwrap();
        assert!(
            l[0].contains("classid 6d69:100 "),
            "group 0 is created again: {}",
            l[0]
        );
        assert!(
            l.iter().any(|x| x.contains("handle 100:5:1 ")),
            "nodes were given back"
        );
        let mut delack = rule("198.19.0.6", 1);
        delack.up = "delay=1ms,ack_every=2".parse().unwrap();
        s.install(&[delack]).unwrap();
        assert_eq!(s.ack_left_out, 1, "delayed-ACK shaping left out is counted");
    }
}
