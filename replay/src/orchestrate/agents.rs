//! The client stage on several hosts (`mimic replay --agents`): the connections are split
//! among client agents ([`crate::agent`]) by the Community ID of each *original* connection
//! (the shard `analyze --shard K/N` would put it in, agent K of N), each agent's share gets
//! source addresses from that agent's own addresses, the pipes are registered as for a local
//! replay, and every agent gets its share and then one start instant on the wall clock; their
//! results come back as if the client had run here.
//!
//! Why the original flow and not the replay 4-tuple: the replay's source address depends on
//! which agent opens the connection, so it cannot decide the agent; the original 4-tuple is
//! fixed before the replay, the same on every run and host, and is the hash the analysis
//! shards by (connection K of an analysis shard is replayed by agent K).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mimic_core::community_id::Shard;
use mimic_core::flow::Endpoint;
use mimic_core::schema::{ConnectionRow, TableRow};
use mimic_netemu::control::ControlAddr;
use mimic_netemu::lab::{self, LabInfo};
use mimic_netemu::netns;
use serde::Serialize;

use super::{Progress, ReplayError};
use crate::agent::{self, AgentClient, AgentConn, AgentInfo};
use crate::client::{Outcome, Planned};
use crate::spec::{AgentSpec, AgentTarget, ReplayOptions, Target};
use crate::workload::{RequestTiming, Workload};

/// How one agent's share went.
#[derive(Clone, Debug, Serialize)]
pub struct AgentRun {
    /// As given to `--agents`.
    pub agent: String,
    /// Its host name and kernel, as it reported them.
    pub host: String,
    pub kernel: String,
    pub client_addrs: usize,
    pub connections: u64,
    pub ok: u64,
    pub failed: u64,
    /// How late its connections started (p50, p99, max; µs).
    pub start_lateness_us: [u64; 3],
    /// How far ahead of its clock the start instant arrived (ms).
    pub start_lead_ms: f64,
    pub timer_realtime: Option<bool>,
}

/// Agent processes the replay started on lab client hosts: shut down over their channel,
/// then TERM (KILL after 2 s) when dropped.
#[derive(Default)]
struct Started(Vec<(String, Child, PathBuf)>);

impl Drop for Started {
    fn drop(&mut self) {
        for (_, c, _) in self.0.iter_mut() {
            // SAFETY: SIGTERM to a child we spawned and have not reaped.
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            let until = Instant::now() + Duration::from_secs(2);
            while Instant::now() < until {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agents of a replay, connected.
pub(super) struct Agents {
    agents: Vec<(String, AgentClient, AgentInfo)>,
    started: Started,
}

fn err(agent: &str, e: impl std::fmt::Display) -> ReplayError {
    ReplayError::Invalid(format!("agent {agent}: {e}"))
}

/// A failed call to an agent; one that ran out of time says which flag sets the limit.
fn call_err(agent: &str, e: mimic_netemu::control::ControlError) -> ReplayError {
    let hint = match e {
        mimic_netemu::control::ControlError::Timeout { .. } => {
            "; if the agent is only slow, raise --agent-timeout"
        }
        _ => "",
    };
    err(agent, format_args!("{e}{hint}"))
}

impl Agents {
    /// Starts the agents on lab client hosts (the lab must be up; client hosts it lacks are
    /// added, so this runs before the emulator starts) and connects to every agent.
    /// `timer_cpus` go to the agents it starts.
    pub fn start(
        opts: &ReplayOptions,
        tls: &crate::control::ControllerTls,
        work: &Path,
        timer_cpus: Option<Vec<usize>>,
        stop: &AtomicBool,
    ) -> Result<Agents, ReplayError> {
        let mut started = Started::default();
        let mut addrs: Vec<(String, ControlAddr)> = Vec::new();
        // the lab's client hosts the agents name, added when missing (before the emulator
        // starts: the client segment is rewired)
        if let Target::Lab { name, .. } = &opts.target {
            let info = LabInfo::for_name(name)?;
            let need = opts
                .agents
                .iter()
                .filter_map(|t| match t {
                    AgentTarget::LabHost(r) => info.client_host_named(r),
                    AgentTarget::Remote(_) => None,
                })
                .map(|h| h.addr.octets()[3] as u32 - 1)
                .max()
                .unwrap_or(1);
            if need > lab::client_count(name)? {
                lab::add_clients(name, need)?;
            }
        }
        for t in &opts.agents {
            match t {
                AgentTarget::Remote(a) => addrs.push((t.to_string(), a.clone())),
                AgentTarget::LabHost(role) => {
                    let Target::Lab { name, .. } = &opts.target else {
                        return Err(ReplayError::Invalid(format!(
                            "--agents {role}: a lab client host needs --lab (name remote agents by HOST:PORT)"
                        )));
                    };
                    let info = LabInfo::for_name(name)?;
                    let h = info.client_host_named(role).ok_or_else(|| {
                        err(
                            role,
                            format!(
                                "no such lab client host (cli, cli2 … cli{})",
                                lab::MAX_CLIENTS
                            ),
                        )
                    })?;
                    if !netns::exists(&h.ns) {
                        return Err(err(
                            role,
                            format!(
                                "lab {name} has no host {} (`mimic lab up {name} --clients N`)",
                                h.ns
                            ),
                        ));
                    }
                    let control = ControlAddr::Unix(
                        info.runtime_dir
                            .join(format!("agent-{role}-{}.sock", std::process::id())),
                    );
                    let mut spec =
                        AgentSpec::new(control.clone(), info.pki_dir.clone(), vec![h.pool]);
                    spec.timer_cpus = timer_cpus.clone();
                    let log = work.join(format!("agent-{role}.log"));
                    let f = std::fs::File::create(&log)
                        .map_err(|e| ReplayError::Io(format!("{}: {e}", log.display())))?;
                    let f2 = f.try_clone().map_err(|e| ReplayError::Io(e.to_string()))?;
                    let args =
                        std::iter::once(std::ffi::OsString::from("-q")).chain(spec.to_args());
                    let mut cmd = netns::command(&h.ns, &opts.exe, args);
                    cmd.stdin(Stdio::null()).stdout(f).stderr(f2);
                    let child = cmd.spawn().map_err(|e| err(role, e))?;
                    started.0.push((role.clone(), child, log));
                    addrs.push((role.clone(), control));
                }
            }
        }
        let mut agents = Vec::new();
        for (name, addr) in addrs {
            let until = Instant::now() + Duration::from_secs(15);
            let mut c = loop {
                super::interrupted(stop)?;
                match AgentClient::connect(&addr, tls) {
                    Ok(c) => break c,
                    Err(e) if e.is_refusal() => return Err(err(&name, e)),
                    Err(e) => {
                        let ours = started.0.iter_mut().find(|(r, _, _)| *r == name);
                        if let Some((_, child, log)) = ours {
                            if !matches!(child.try_wait(), Ok(None)) {
                                return Err(err(&name, format!("it exited; log: {}", tail(log))));
                            }
                        }
                        if Instant::now() > until {
                            return Err(err(
                                &name,
                                format!(
                                    "not reachable within 15s{}",
                                    super::error::last_try(&e.to_string())
                                ),
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            };
            c.set_limit(opts.agent_timeout);
            let info = c.info().map_err(|e| call_err(&name, e))?;
            if info.client_addrs.is_empty() {
                return Err(err(&name, "it has no client addresses"));
            }
            agents.push((name, c, info));
        }
        // two agents on one address would collide on ports: every 4-tuple must be distinct
        let mut owner: HashMap<Ipv4Addr, &str> = HashMap::new();
        for (name, _, info) in &agents {
            for a in &info.client_addrs {
                if let Some(o) = owner.insert(*a, name) {
                    return Err(ReplayError::Invalid(format!(
                        "agents {o} and {name} both use client address {a}; give each agent its own --client-addr"
                    )));
                }
            }
        }
        Ok(Agents { agents, started })
    }

    /// Every agent's source addresses (for the server's allow list).
    pub fn client_addrs(&self) -> Vec<Ipv4Addr> {
        self.agents
            .iter()
            .flat_map(|(_, _, i)| i.client_addrs.iter().copied())
            .collect()
    }

    /// The source address and port of each connection (in the workload's order) and the agent
    /// that opens it: agent K of N gets the connections of analysis shard K; within an agent
    /// the j-th connection gets address j mod n of the agent's and port 20000 + j div n.
    pub fn assign(
        &self,
        wl: &Workload,
        input: &Path,
    ) -> Result<(Vec<SocketAddrV4>, Vec<usize>), ReplayError> {
        let shards = shards_of(wl, input, self.agents.len() as u32)?;
        let mut next = vec![0usize; self.agents.len()];
        let mut locals = Vec::with_capacity(shards.len());
        for &k in &shards {
            let addrs = &self.agents[k].2.client_addrs;
            let j = next[k];
            next[k] += 1;
            let port = 20_000 + j / addrs.len();
            if port > 65_000 {
                return Err(err(
                    &self.agents[k].0,
                    format!(
                        "{} connections do not fit its {} client addresses (20000-65000 ports each)",
                        j + 1,
                        addrs.len()
                    ),
                ));
            }
            locals.push(SocketAddrV4::new(addrs[j % addrs.len()], port as u16));
        }
        Ok((locals, shards))
    }

    /// Hands each agent its share of `plans` (agent of connection i: `owner[i]`), starts them
    /// all on one wall-clock instant, follows their progress and returns every outcome in
    /// plan order with a summary per agent.
    pub fn run(
        &mut self,
        plans: Vec<Planned>,
        owner: &[usize],
        request_timing: RequestTiming,
        progress: &Progress,
        stop: &AtomicBool,
    ) -> Result<(Vec<Outcome>, Vec<AgentRun>), ReplayError> {
        // the plans' instants as offsets from one reference, which becomes the start instant
        let base = plans
            .iter()
            .map(|p| p.start)
            .min()
            .unwrap_or_else(Instant::now);
        let lead_left = base.saturating_duration_since(Instant::now());
        let mut shares: Vec<Vec<AgentConn>> = vec![Vec::new(); self.agents.len()];
        let mut last_end = Duration::ZERO;
        for (p, &k) in plans.iter().zip(owner) {
            let offset = p.start.duration_since(base);
            last_end = last_end.max(offset + p.limit);
            shares[k].push(AgentConn {
                index: p.index,
                spec: (*p.spec).clone(),
                local: p.local,
                server: p.server,
                offset_ns: offset.as_nanos() as i64,
                limit_ms: p.limit.as_millis() as u64,
            });
        }
        drop(plans);
        for ((name, c, _), share) in self.agents.iter_mut().zip(&shares) {
            let n = c
                .load(share, request_timing)
                .map_err(|e| call_err(name, e))?;
            if n != share.len() as u64 {
                return Err(err(
                    name,
                    format!("loaded {n} of {} connections", share.len()),
                ));
            }
            super::interrupted(stop)?;
        }
        // as much lead as the plan had left, and at least half a second for the start orders
        let lead = lead_left.max(Duration::from_millis(500));
        let t0 = agent::now_unix_ns() + lead.as_nanos() as i64;
        for (name, c, _) in self.agents.iter_mut() {
            c.start(t0).map_err(|e| call_err(name, e))?;
        }
        let deadline = Instant::now() + lead + last_end + Duration::from_secs(60);
        loop {
            let mut finished = 0;
            let (mut done, mut failed, mut in_flight, mut max) = (0, 0, 0, 0);
            let mut broken = None;
            for (name, c, _) in self.agents.iter_mut() {
                let st = match c.status() {
                    Ok(st) => st,
                    Err(e) => {
                        broken = Some(call_err(name, e));
                        break;
                    }
                };
                if st.phase == "failed" {
                    broken = Some(err(name, st.error.unwrap_or_default()));
                    break;
                }
                if st.phase == "finished" {
                    finished += 1;
                }
                done += st.done;
                failed += st.failed;
                in_flight += st.in_flight;
                max += st.max_in_flight;
            }
            if let Some(e) = broken {
                // the others stop opening connections rather than run on unwatched
                for (_, c, _) in self.agents.iter_mut() {
                    let _ = c.abort();
                }
                return Err(e);
            }
            progress.done.store(done, Ordering::Relaxed);
            progress.failed.store(failed, Ordering::Relaxed);
            progress.in_flight.store(in_flight, Ordering::Relaxed);
            progress.max_in_flight.store(max, Ordering::Relaxed);
            if finished == self.agents.len() {
                break;
            }
            if stop.load(Ordering::Relaxed) {
                for (_, c, _) in self.agents.iter_mut() {
                    let _ = c.abort();
                }
                return Err(ReplayError::Interrupted);
            }
            if Instant::now() > deadline {
                for (_, c, _) in self.agents.iter_mut() {
                    let _ = c.abort();
                }
                return Err(ReplayError::Invalid(
                    "the agents did not finish their connections in time".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut outcomes: Vec<Outcome> = Vec::new();
        let mut runs = Vec::new();
        for ((name, c, info), share) in self.agents.iter_mut().zip(&shares) {
            let r = c.results(share.len()).map_err(|e| call_err(name, e))?;
            if r.outcomes.len() != share.len() {
                tracing::warn!(
                    "agent {name}: {} results for {} connections",
                    r.outcomes.len(),
                    share.len()
                );
            }
            let mine: Vec<Outcome> = r.outcomes.into_iter().map(Outcome::from).collect();
            let mut late: Vec<u64> = mine
                .iter()
                .map(|o| o.start_lateness.as_micros() as u64)
                .collect();
            late.sort_unstable();
            runs.push(AgentRun {
                agent: name.clone(),
                host: info.hostname.clone(),
                kernel: info.kernel.clone(),
                client_addrs: info.client_addrs.len(),
                connections: mine.len() as u64,
                ok: mine.iter().filter(|o| o.result.is_ok()).count() as u64,
                failed: mine.iter().filter(|o| o.result.is_err()).count() as u64,
                start_lateness_us: [
                    quantile(&late, 0.5),
                    quantile(&late, 0.99),
                    late.last().copied().unwrap_or(0),
                ],
                start_lead_ms: r.start_lead_ns as f64 / 1e6,
                timer_realtime: r.timer_realtime,
            });
            outcomes.extend(mine);
        }
        outcomes.sort_by_key(|o| o.index);
        Ok((outcomes, runs))
    }

    /// Shuts down the agents this replay started (remote ones keep serving).
    pub fn stop(mut self) {
        for (name, c, _) in self.agents.iter_mut() {
            if self.started.0.iter().any(|(r, _, _)| r == name) {
                let _ = c.shutdown();
            }
        }
        drop(self.started);
    }
}

pub(super) fn quantile(sorted: &[u64], f: f64) -> u64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * f).round() as usize)
        .copied()
        .unwrap_or(0)
}

fn tail(p: &Path) -> String {
    let s = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// The agent (0-based) of each connection of `wl`: the shard of `n` its original flow falls
/// in (`analyze --shard K/N`'s hash of client and server address and port); a connection whose
/// original addresses the database lacks goes by its id (`id mod n`).
fn shards_of(wl: &Workload, input: &Path, n: u32) -> Result<Vec<usize>, ReplayError> {
    let c = mimic_core::db::open_existing(input)?;
    let sq = |e: rusqlite::Error| ReplayError::Invalid(format!("{}: {e}", input.display()));
    let mut flows: HashMap<i64, (Endpoint, Endpoint)> = HashMap::new();
    for row in ConnectionRow::read_all(&c, "id").map_err(sq)? {
        let ep = |ip: &str, port: i64| -> Option<Endpoint> {
            Some(Endpoint::new(
                ip.parse::<IpAddr>().ok()?,
                u16::try_from(port).ok()?,
            ))
        };
        if let (Some(a), Some(b)) = (
            ep(&row.client_ip, row.client_port),
            ep(&row.server_ip, row.server_port),
        ) {
            flows.insert(row.id, (a, b));
        }
    }
    Ok(wl
        .conns
        .iter()
        .map(|c| match flows.get(&c.orig_id) {
            Some((a, b)) => Shard::of(a, b, n) as usize - 1,
            None => c.orig_id.rem_euclid(n as i64) as usize,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_sorted_values() {
        assert_eq!(quantile(&[], 0.5), 0);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), 51);
        assert_eq!(quantile(&v, 0.99), 99);
        assert_eq!(quantile(&v, 1.0), 100);
    }
}
