//! The network emulator's commands on the control channel (`mimic-control`: TLS 1.3 with
//! mutual certificate authentication, newline-delimited JSON). Requests:
//! `add_flows {rules}`, `update_flow {id, up?, down?}`, `remove_flows {ids}`, `counters`,
//! `stats`, `set_default {up, down}` (null clears), `add_prefix {rule}`, `shutdown`.
//! Requests run on the datapath thread between packets; a batch of flow rules is added all
//! or none.
//!
//! A router with kernel pipes (`mimic netemu run --backend netem`, [`serve_kernel`]) answers
//! `kernel_info`, `install_pipes {rules}` (all or none; the pipe ids), `remove_pipes {ids}`,
//! `teardown` and `shutdown` instead; each side refuses the other's requests with a message
//! naming the backend it runs.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

pub use mimic_control::{ControlAddr, ControlError, ControllerTls, Listener, RoleTls};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::PipeConfig;
use crate::datapath::{DatapathStats, Job, Waker};
use crate::engine::{EngineStats, FlowRule, PipeCounters, PrefixRule, RuleId};
use crate::kernel_router::{KernelRouter, KernelRouterInfo, PipeId};
use crate::pipe::Counters;

/// The emulator's role name: its certificate is `netemu.crt` / `netemu.key`.
pub const ROLE: &str = "netemu";

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    AddFlows {
        rules: Vec<FlowRule>,
    },
    UpdateFlow {
        id: RuleId,
        up: Option<PipeConfig>,
        down: Option<PipeConfig>,
    },
    RemoveFlows {
        ids: Vec<RuleId>,
    },
    Counters,
    Stats,
    SetDefault {
        up: Option<PipeConfig>,
        down: Option<PipeConfig>,
    },
    AddPrefix {
        rule: PrefixRule,
    },
    Shutdown,
    KernelInfo,
    InstallPipes {
        rules: Vec<FlowRule>,
    },
    RemovePipes {
        ids: Vec<PipeId>,
    },
    Teardown,
}

/// The datapath's answer to a kernel router's request.
const NOT_KERNEL: &str = "this router runs mimic's own datapath (`mimic netemu run`), not kernel pipes: start it with `mimic netemu run --backend netem --client-if IF --server-if IF` on a router whose kernel has sch_netem";
/// A kernel router's answer to a datapath request.
const NOT_DATAPATH: &str = "this router installs kernel pipes (`mimic netemu run --backend netem`), it has no datapath of mimic's: use `mimic replay --emulator netem`, or start the router without --backend netem";

/// Final counters of a removed flow rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemovedFlow {
    pub id: RuleId,
    pub up: Counters,
    pub down: Counters,
}

/// Engine and datapath counters of a running emulator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    pub engine: EngineStats,
    pub datapath: DatapathStats,
}

/// A blocking client of a running emulator (`mimic netemu run`).
pub struct Client(mimic_control::Client);

impl Client {
    /// Connects to the emulator at `addr` and authenticates both sides.
    pub fn connect(addr: &ControlAddr, tls: &ControllerTls) -> Result<Client, ControlError> {
        mimic_control::Client::connect(addr, tls, ROLE).map(Client)
    }

    fn call(&mut self, req: &Request) -> Result<Value, ControlError> {
        self.0.call(req)
    }

    fn decode<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, ControlError> {
        serde_json::from_value(v).map_err(|e| ControlError::Protocol(e.to_string()))
    }

    /// Adds flow rules in one batch (all or none); returns their ids in order.
    pub fn add_flows(&mut self, rules: &[FlowRule]) -> Result<Vec<RuleId>, ControlError> {
        let v = self.call(&Request::AddFlows {
            rules: rules.to_vec(),
        })?;
        Self::decode(v)
    }

    /// Changes a rule's pipes in place (`None` leaves that direction as it is).
    pub fn update_flow(
        &mut self,
        id: RuleId,
        up: Option<&PipeConfig>,
        down: Option<&PipeConfig>,
    ) -> Result<(), ControlError> {
        self.call(&Request::UpdateFlow {
            id,
            up: up.cloned(),
            down: down.cloned(),
        })
        .map(|_| ())
    }

    /// Removes rules; returns the final counters of those that existed.
    pub fn remove_flows(&mut self, ids: &[RuleId]) -> Result<Vec<RemovedFlow>, ControlError> {
        let v = self.call(&Request::RemoveFlows { ids: ids.to_vec() })?;
        Self::decode(v)
    }

    pub fn counters(&mut self) -> Result<Vec<PipeCounters>, ControlError> {
        let v = self.call(&Request::Counters)?;
        Self::decode(v)
    }

    pub fn stats(&mut self) -> Result<RunStats, ControlError> {
        let v = self.call(&Request::Stats)?;
        Self::decode(v)
    }

    /// Replaces the default pipes (`None` for both: unmatched traffic passes unshaped).
    pub fn set_default(
        &mut self,
        up: Option<&PipeConfig>,
        down: Option<&PipeConfig>,
    ) -> Result<(), ControlError> {
        self.call(&Request::SetDefault {
            up: up.cloned(),
            down: down.cloned(),
        })
        .map(|_| ())
    }

    pub fn add_prefix(&mut self, rule: &PrefixRule) -> Result<usize, ControlError> {
        let v = self.call(&Request::AddPrefix { rule: rule.clone() })?;
        Self::decode(v)
    }

    /// Asks the emulator to stop (it prints its counters and exits 0; a kernel router
    /// removes its pipes first).
    pub fn shutdown(&mut self) -> Result<(), ControlError> {
        self.call(&Request::Shutdown).map(|_| ())
    }

    /// A kernel router's backend, kernel and counts; refused by mimic's datapath.
    pub fn kernel_info(&mut self) -> Result<KernelRouterInfo, ControlError> {
        let v = self.call(&Request::KernelInfo)?;
        Self::decode(v)
    }

    /// Installs kernel pipes for `rules` on a kernel router in one `tc -batch` (all or none);
    /// their ids, in order.
    pub fn install_pipes(&mut self, rules: &[FlowRule]) -> Result<Vec<PipeId>, ControlError> {
        let v = self.call(&Request::InstallPipes {
            rules: rules.to_vec(),
        })?;
        Self::decode(v)
    }

    /// Removes kernel pipes; how many of `ids` were installed.
    pub fn remove_pipes(&mut self, ids: &[PipeId]) -> Result<usize, ControlError> {
        let v = self.call(&Request::RemovePipes { ids: ids.to_vec() })?;
        Self::decode(v)
    }

    /// Removes everything the kernel router installed (it keeps serving; later installs are
    /// refused).
    pub fn teardown(&mut self) -> Result<(), ControlError> {
        self.call(&Request::Teardown).map(|_| ())
    }
}

/// Serves a kernel router's control channel until `stop` is set (on the calling thread):
/// requests run one at a time on `router`; `shutdown` tears the pipes down and sets `stop`.
pub fn serve_kernel(
    listener: Listener,
    tls: RoleTls,
    router: Arc<std::sync::Mutex<KernelRouter>>,
    stop: Arc<AtomicBool>,
) {
    let halt = stop.clone();
    let handler: mimic_control::Handler = Arc::new(move |v: Value| {
        let req: Request = serde_json::from_value(v).map_err(|e| format!("bad request: {e}"))?;
        let mut r = router.lock().unwrap_or_else(|p| p.into_inner());
        match req {
            Request::KernelInfo => Ok(json!(r.info())),
            Request::InstallPipes { rules } => r
                .install(&rules)
                .map(|ids| json!(ids))
                .map_err(|e| e.to_string()),
            Request::RemovePipes { ids } => {
                r.remove(&ids).map(|n| json!(n)).map_err(|e| e.to_string())
            }
            Request::Teardown => r.teardown().map(|_| Value::Null).map_err(|e| e.to_string()),
            Request::Shutdown => {
                let t = r.teardown();
                halt.store(true, std::sync::atomic::Ordering::Relaxed);
                t.map(|_| Value::Null).map_err(|e| e.to_string())
            }
            Request::AddFlows { .. }
            | Request::UpdateFlow { .. }
            | Request::RemoveFlows { .. }
            | Request::Counters
            | Request::Stats
            | Request::SetDefault { .. }
            | Request::AddPrefix { .. } => Err(NOT_DATAPATH.to_string()),
        }
    });
    mimic_control::Server::new(listener, tls, handler, stop).run()
}

/// Serves the control channel until `stop` is set (on the calling thread), each request run
/// on the datapath thread as a [`Job`].
pub fn serve(
    listener: Listener,
    tls: RoleTls,
    jobs: Sender<Job>,
    waker: Waker,
    stop: Arc<AtomicBool>,
) {
    let handler: mimic_control::Handler = Arc::new(move |v: Value| {
        let req: Request = serde_json::from_value(v).map_err(|e| format!("bad request: {e}"))?;
        let resp = run_on_datapath(req, &jobs, waker);
        if resp["ok"] == Value::Bool(true) {
            Ok(resp["result"].clone())
        } else {
            Err(resp["error"]
                .as_str()
                .unwrap_or("unknown error")
                .to_string())
        }
    });
    mimic_control::Server::new(listener, tls, handler, stop).run()
}

fn run_on_datapath(req: Request, jobs: &Sender<Job>, waker: Waker) -> Value {
    let (tx, rx) = mpsc::sync_channel::<Value>(1);
    let job: Job = Box::new(move |ctx| {
        let r: Result<Value, String> = match req {
            Request::AddFlows { rules } => ctx
                .engine
                .add_flows(&rules)
                .map(|ids| json!(ids))
                .map_err(|e| e.to_string()),
            Request::UpdateFlow { id, up, down } => ctx
                .engine
                .update_flow(id, up, down, ctx.now)
                .map(|_| Value::Null)
                .map_err(|e| e.to_string()),
            Request::RemoveFlows { ids } => {
                let v: Vec<RemovedFlow> = ctx
                    .engine
                    .remove_flows(&ids, ctx.now)
                    .into_iter()
                    .map(|(id, up, down)| RemovedFlow { id, up, down })
                    .collect();
                Ok(json!(v))
            }
            Request::Counters => Ok(json!(ctx.engine.counters())),
            Request::Stats => Ok(json!(RunStats {
                engine: ctx.engine.stats(),
                datapath: ctx.stats.snapshot(),
            })),
            Request::SetDefault { up, down } => match (up, down) {
                (Some(u), Some(d)) => ctx
                    .engine
                    .set_default(Some((u, d)))
                    .map(|_| Value::Null)
                    .map_err(|e| e.to_string()),
                (None, None) => ctx
                    .engine
                    .set_default(None)
                    .map(|_| Value::Null)
                    .map_err(|e| e.to_string()),
                _ => Err("set_default needs both up and down (or neither)".into()),
            },
            Request::AddPrefix { rule } => ctx
                .engine
                .add_prefix(rule)
                .map(|i| json!(i))
                .map_err(|e| e.to_string()),
            Request::Shutdown => {
                *ctx.stop = true;
                Ok(Value::Null)
            }
            Request::KernelInfo
            | Request::InstallPipes { .. }
            | Request::RemovePipes { .. }
            | Request::Teardown => Err(NOT_KERNEL.to_string()),
        };
        let _ = tx.send(match r {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": e}),
        });
    });
    if jobs.send(job).is_err() {
        return json!({"ok": false, "error": "the datapath has stopped"});
    }
    waker.wake();
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| json!({"ok": false, "error": "the datapath did not answer"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole channel against an engine driven by a thread standing in for the datapath.
    #[test]
    fn a_certificate_is_required_and_requests_reach_the_engine() {
        use crate::engine::{Engine, Limits, PipeTable};
        use std::sync::atomic::Ordering;
        let tmp = tempfile::Builder::new()
            .prefix("mimic-ctl-")
            .tempdir()
            .unwrap();
        let dir = tmp.path();
        let pki = dir.join("pki");
        mimic_control::pki::init(&pki, &Default::default()).unwrap();
        let tls = RoleTls::load(&pki, ROLE).unwrap();
        let addr = ControlAddr::Unix(dir.join("c.sock"));
        let listener = Listener::bind(&addr).unwrap();
        let (jtx, jrx) = mpsc::channel::<Job>();
        let waker = Waker::new().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let srv = std::thread::spawn(move || serve(listener, tls, jtx, waker, s2));
        let s3 = stop.clone();
        let dp = std::thread::spawn(move || {
            let mut engine: Engine<u32> =
                Engine::new(&PipeTable::default(), Limits::default(), 1).unwrap();
            let stats = DatapathStats::default();
            let mut halt = false;
            while !halt && !s3.load(Ordering::Relaxed) {
                if let Ok(job) = jrx.recv_timeout(Duration::from_millis(50)) {
                    job(&mut crate::datapath::Ctx {
                        engine: &mut engine,
                        stats: &stats,
                        now: 0,
                        stop: &mut halt,
                    });
                }
            }
            halt
        });
        assert!(matches!(
            Client::connect(&addr, &ControllerTls::without_identity(&pki).unwrap()),
            Err(ControlError::Auth { .. })
        ));
        let mut c = Client::connect(&addr, &ControllerTls::load(&pki).unwrap()).unwrap();
        let rules: Vec<FlowRule> = (0..10_000u16)
            .map(|p| FlowRule {
                client: std::net::SocketAddr::new([198, 19, 0, 1].into(), 1024 + p),
                server: "198.18.0.1:80".parse().unwrap(),
                up: "delay=10ms".parse().unwrap(),
                down: "delay=10ms,rate=1mbit".parse().unwrap(),
            })
            .collect();
        let ids = c.add_flows(&rules).unwrap();
        assert_eq!(ids.len(), 10_000);
        assert!(
            matches!(c.add_flows(&rules[..1]), Err(ControlError::Refused { msg, .. }) if msg.contains("already has rule"))
        );
        c.update_flow(ids[0], Some(&"delay=1ms".parse().unwrap()), None)
            .unwrap();
        let counters = c.counters().unwrap();
        assert_eq!(counters.len(), 20_000);
        assert_eq!(counters[0].config.delay, 1_000_000);
        assert!(
            matches!(c.kernel_info(), Err(ControlError::Refused { msg, .. }) if msg.contains("--backend netem")),
            "the datapath refuses a kernel router's request, naming the backend"
        );
        let removed = c.remove_flows(&ids[..10]).unwrap();
        assert_eq!(removed.len(), 10);
        assert_eq!(c.stats().unwrap().engine.flow_rules, 9_990);
        c.shutdown().unwrap();
        assert!(dp.join().unwrap(), "shutdown reached the datapath");
        stop.store(true, Ordering::Relaxed);
        srv.join().unwrap();
    }
}
