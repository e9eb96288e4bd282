//! Was this replay's timing what it was asked to be? A replay is an instrument: when the host
//! it runs on cannot keep its timing (other real-time processes, an overloaded CPU, a guest
//! spinning beside it), every response time it measures carries the instrument's own error,
//! and a comparison of two such replays measures the host, not the change.
//!
//! The judgement uses what the replay measured of itself, end to end and per part:
//! * **round trips as configured**: each replayed connection's min RTT, as the analysis of the
//!   capture measured it, against the delay its pipes were given (up plus down). A connection
//!   agrees when the two are within 10% or 2 ms (the own-lab criterion, 98.8% there). This
//!   catches delay added anywhere — the emulator, the kernel's softirq work, the end hosts —
//!   and is judged only at the server vantage point, where the capture measures the client's
//!   path.
//! * **connection starts** (the client emulator), **server delays** (the server emulator) and
//!   **departures** (mimic's datapath), each by its p99 lateness.
//!
//! The verdict is `distorted` when fewer than [`RTT_AGREE_MIN`] of the connections agree or
//! any p99 lateness is above [`LATE_P99_MAX_US`]; `ok` otherwise; `not judged` when nothing
//! could be measured. Beside it, the share of the host's CPU time its hypervisor took during
//! the replay (steal): not a criterion, but where it is [`STOLEN_NOTE`] or more a distorted
//! replay names it as the likely cause (a descheduled vCPU stops every thread on it, pinned
//! and real-time alike; on this project's VMs healthy replays had 0.01-1.2% stolen, distorted
//! ones 3.5-8.4%). It goes into `meta` (`timing_health`, and the figures as JSON in
//! `timing_health_detail`), the replay's summary, and `mimic compare`'s report, which warns
//! when it compares a distorted replay.

use std::collections::HashMap;
use std::path::Path;

use mimic_core::db::{set_meta, DbError};
use mimic_netemu::control::RunStats;
use serde::Serialize;

use super::db::PipeRecord;
use super::ReplayError;
use crate::server::ServerStats;
use crate::workload::Workload;

/// Share of replayed connections whose min RTT must agree with their pipes' delay.
pub const RTT_AGREE_MIN: f64 = 0.90;
/// A connection's min RTT agrees with its pipes when within this share of the configured
/// round trip ...
const RTT_REL_TOL: f64 = 0.10;
/// ... or within this many µs of it.
const RTT_ABS_TOL_US: f64 = 2_000.0;
/// Largest p99 lateness (µs) of starts, server delays and departures in a healthy replay:
/// the accuracy criteria are "within 2 ms".
pub const LATE_P99_MAX_US: u64 = 2_000;
/// Share of the host's CPU time taken by its hypervisor from which a distorted replay names
/// it as the likely cause.
pub const STOLEN_NOTE: f64 = 0.02;

/// The judgement and the figures it rests on.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TimingHealth {
    /// `ok`, `distorted` or `not judged`.
    pub verdict: &'static str,
    /// What made it distorted, in words (empty when ok).
    pub reasons: Vec<String>,
    /// Replayed connections with a measured min RTT and configured pipes, and the share of
    /// them whose min RTT agrees (None: not judged, e.g. a capture at the client).
    pub rtt_judged: u64,
    pub rtt_agree: Option<f64>,
    /// Median of (measured − configured) min RTT over those connections (µs).
    pub rtt_excess_p50_us: Option<f64>,
    /// 90th percentile of the same (µs).
    pub rtt_excess_p90_us: Option<f64>,
    pub start_late_p99_us: Option<u64>,
    pub server_delay_late_p99_us: Option<u64>,
    /// mimic's datapath: departures after their due time, and frames waiting in its ring
    /// (None: kernel pipes, or no statistics).
    pub departure_late_p99_us: Option<u64>,
    pub ring_wait_p99_us: Option<u64>,
    /// The host's load average (1, 5, 15 minutes) when the replay ended.
    pub load: Option<[f64; 3]>,
    /// CPU time the hypervisor ran something else on this host's CPUs during the replay
    /// (steal, all CPUs together), ms, and its share of the CPUs' time (None: unreadable).
    pub stolen_ms: Option<u64>,
    pub stolen_share: Option<f64>,
    /// The likely cause of a distorted verdict, in words, where the replay can name one (the
    /// hypervisor's steal, [`STOLEN_NOTE`] or more); `mimic compare` shows it with the reasons.
    pub cause: Option<String>,
}

impl TimingHealth {
    pub fn distorted(&self) -> bool {
        self.verdict == "distorted"
    }

    /// One line for the summary.
    pub fn describe(&self) -> String {
        let rtt = match self.rtt_agree {
            Some(a) => format!(
                "min RTT as configured for {:.1}% of {} (median excess {:.2} ms)",
                100.0 * a,
                self.rtt_judged,
                self.rtt_excess_p50_us.unwrap_or(0.0) / 1000.0
            ),
            None => "min RTT not judged".to_string(),
        };
        let load = self
            .load
            .map(|l| format!(", host load {:.1} {:.1} {:.1}", l[0], l[1], l[2]))
            .unwrap_or_default();
        match self.verdict {
            "distorted" => format!(
                "timing health: DISTORTED ({}): {rtt}{load}{}; this replay's response times carry the host's own error — rerun it on a quieter host",
                self.reasons.join("; "),
                self.cause.as_ref().map(|n| format!("; {n}")).unwrap_or_default()
            ),
            v => format!("timing health: {v}: {rtt}{load}"),
        }
    }
}

/// The cause a verdict names for a stolen share ([`TimingHealth::cause`]).
fn steal_note(verdict: &str, stolen_share: Option<f64>) -> Option<String> {
    let share = stolen_share.filter(|&s| verdict == "distorted" && s >= STOLEN_NOTE)?;
    Some(format!(
        "the hypervisor took {:.1}% of the host's CPU time during the replay (steal), the likely cause",
        100.0 * share
    ))
}

/// CPU time the hypervisor has taken from this host's CPUs so far, all together (ms), and
/// how many CPUs that is of; None where `/proc/stat` cannot be read.
pub(super) fn steal_now() -> Option<(f64, usize)> {
    let per_cpu = mimic_core::cpu::steal_ms_per_cpu();
    (!per_cpu.is_empty()).then(|| (per_cpu.iter().sum(), per_cpu.len()))
}

/// What the hypervisor took since `before` (from [`steal_now`]) over `elapsed`: (ms, share of
/// the CPUs' time).
pub(super) fn stolen_since(
    before: Option<(f64, usize)>,
    elapsed: std::time::Duration,
) -> Option<(f64, f64)> {
    let (b, cpus) = before?;
    let (now, _) = steal_now()?;
    let ms = (now - b).max(0.0);
    let span_ms = elapsed.as_secs_f64() * 1e3 * cpus as f64;
    Some((ms, if span_ms > 0.0 { ms / span_ms } else { 0.0 }))
}

/// The measured inputs of a judgement.
pub(super) struct Measured<'a> {
    /// (configured RTT, measured min RTT) in µs, per replayed connection (empty: not judged).
    pub rtts: &'a [(f64, f64)],
    pub rtt_judged: bool,
    /// None: no connection was started.
    pub start_late_p99_us: Option<u64>,
    pub server: Option<&'a ServerStats>,
    pub netemu: Option<&'a RunStats>,
    pub load: Option<[f64; 3]>,
    /// From [`stolen_since`].
    pub stolen: Option<(f64, f64)>,
}

/// The `q` quantile of sorted values, the nearest rank (None when empty); the replay's
/// start-lateness figures use it too.
pub(super) fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
}

/// Judges from measured figures (the rule in the module's documentation).
pub(super) fn judge(m: &Measured) -> TimingHealth {
    let mut h = TimingHealth {
        start_late_p99_us: m.start_late_p99_us,
        server_delay_late_p99_us: m.server.map(|s| {
            s.response_delay_error
                .p99_us
                .max(s.query_delay_error.p99_us)
        }),
        departure_late_p99_us: m.netemu.map(|n| n.datapath.late_p99_ns / 1000),
        ring_wait_p99_us: m.netemu.map(|n| n.datapath.rx_wait_p99_ns / 1000),
        load: m.load,
        stolen_ms: m.stolen.map(|(ms, _)| ms.round() as u64),
        stolen_share: m.stolen.map(|(_, share)| share),
        ..Default::default()
    };
    let mut judged_anything = false;
    if m.rtt_judged && !m.rtts.is_empty() {
        judged_anything = true;
        let agree = m
            .rtts
            .iter()
            .filter(|(cfg, got)| (got - cfg).abs() <= (RTT_REL_TOL * cfg).max(RTT_ABS_TOL_US))
            .count();
        let share = agree as f64 / m.rtts.len() as f64;
        let mut excess: Vec<f64> = m.rtts.iter().map(|(cfg, got)| got - cfg).collect();
        excess.sort_by(f64::total_cmp);
        h.rtt_judged = m.rtts.len() as u64;
        h.rtt_agree = Some(share);
        h.rtt_excess_p50_us = quantile(&excess, 0.5);
        h.rtt_excess_p90_us = quantile(&excess, 0.9);
        if share < RTT_AGREE_MIN {
            h.reasons.push(format!(
                "min RTT as configured for only {:.1}% of {} connections (at least {:.0}% expected; 90th percentile {:+.1} ms)",
                100.0 * share,
                m.rtts.len(),
                100.0 * RTT_AGREE_MIN,
                h.rtt_excess_p90_us.unwrap_or(0.0) / 1000.0
            ));
        }
    }
    let mut late = |what: &str, v: Option<u64>| {
        if let Some(v) = v {
            judged_anything = true;
            if v > LATE_P99_MAX_US {
                h.reasons.push(format!(
                    "{what} p99 {:.1} ms late (at most {:.0} ms expected)",
                    v as f64 / 1000.0,
                    LATE_P99_MAX_US as f64 / 1000.0
                ));
            }
        }
    };
    late("connection starts", m.start_late_p99_us);
    late("server delays", h.server_delay_late_p99_us);
    late("emulator departures", h.departure_late_p99_us);
    late("frames waiting in the emulator's ring", h.ring_wait_p99_us);
    h.verdict = if !judged_anything {
        "not judged"
    } else if h.reasons.is_empty() {
        "ok"
    } else {
        "distorted"
    };
    h.cause = steal_note(h.verdict, h.stolen_share);
    h
}

/// The host's load average, if /proc says.
pub(super) fn loadavg() -> Option<[f64; 3]> {
    let t = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = t.split_whitespace().map(|x| x.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// Each replayed connection's (configured RTT, measured min RTT) in µs, from the staged
/// replay database (`replay_map` and the analysis' `connections`) and the pipes it was given,
/// with the LAN's own round trip they were shortened by (`--lan-rtt`) added back.
pub(super) fn rtt_pairs(
    db: &Path,
    wl: &Workload,
    pipes: &[PipeRecord],
    lan_rtt_us: u64,
) -> Result<Vec<(f64, f64)>, ReplayError> {
    let sq = |source| DbError::Sqlite {
        path: db.to_path_buf(),
        source,
    };
    let configured: HashMap<i64, f64> = wl
        .conns
        .iter()
        .zip(pipes)
        .map(|(c, p)| {
            // the pipes' delays, the LAN's own round trip they were shortened by and the
            // SYN-ACK's serialization the downstream pipe adds (taken out of the delays)
            let rtt_us = (p.up.delay + p.down.delay) as f64 / 1000.0
                + lan_rtt_us as f64
                + super::plan::synack_serialization_us(c);
            (c.orig_id, rtt_us)
        })
        .collect();
    let c = rusqlite::Connection::open(mimic_core::db::sqlite_name(db)).map_err(sq)?;
    let mut st = c
        .prepare(
            "SELECT m.orig_conn_id, c.min_rtt_us FROM replay_map m
               JOIN connections c ON c.id = m.replay_conn_id
              WHERE m.status = 'ok' AND c.min_rtt_us IS NOT NULL",
        )
        .map_err(sq)?;
    let rows = st
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, f64>(1)?)))
        .map_err(sq)?;
    let mut v = Vec::new();
    for r in rows {
        let (id, got) = r.map_err(sq)?;
        if let Some(&cfg) = configured.get(&id) {
            v.push((cfg, got));
        }
    }
    Ok(v)
}

/// Writes the judgement into the replay database's `meta`.
pub(super) fn write_meta(db: &Path, h: &TimingHealth) -> Result<(), ReplayError> {
    let sq = |source| DbError::Sqlite {
        path: db.to_path_buf(),
        source,
    };
    let c = rusqlite::Connection::open(mimic_core::db::sqlite_name(db)).map_err(sq)?;
    set_meta(&c, "timing_health", h.verdict).map_err(sq)?;
    set_meta(
        &c,
        "timing_health_detail",
        &serde_json::to_string(h).unwrap_or_default(),
    )
    .map_err(sq)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mimic_netemu::control::RunStats;

    fn m<'a>(
        rtts: &'a [(f64, f64)],
        start: Option<u64>,
        netemu: Option<&'a RunStats>,
    ) -> Measured<'a> {
        Measured {
            rtts,
            rtt_judged: true,
            start_late_p99_us: start,
            server: None,
            netemu,
            load: Some([0.5, 0.4, 0.3]),
            stolen: Some((120.0, 0.004)),
        }
    }

    #[test]
    fn round_trips_as_configured_are_healthy() {
        // 40 ms configured, measured a little above (the LAN's own round trip); 2 ms paths
        // measured within 2 ms
        let rtts: Vec<(f64, f64)> = (0..100)
            .map(|i| {
                if i % 2 == 0 {
                    (40_000.0, 40_150.0)
                } else {
                    (2_000.0, 3_900.0)
                }
            })
            .collect();
        let h = judge(&m(&rtts, Some(60), None));
        assert_eq!(h.verdict, "ok", "{h:?}");
        assert_eq!(h.rtt_agree, Some(1.0));
        assert!(h.reasons.is_empty());
        assert!(h
            .describe()
            .starts_with("timing health: ok: min RTT as configured for 100.0% of 100"));
    }

    #[test]
    fn inflated_round_trips_are_distorted_even_when_every_part_says_it_was_on_time() {
        // the demo on a host where a real-time guest starved the kernel's packet work: pipes
        // of 2.5 ms measured 150-500 ms, while no part of mimic saw itself late
        let mut rtts: Vec<(f64, f64)> = (0..80).map(|_| (2_500.0, 2_600.0)).collect();
        rtts.extend((0..20).map(|i| (2_500.0, 150_000.0 + 10_000.0 * i as f64)));
        let h = judge(&m(&rtts, Some(60), None));
        assert_eq!(h.verdict, "distorted");
        assert_eq!(h.rtt_agree, Some(0.8));
        assert!(
            h.reasons[0].contains("only 80.0% of 100"),
            "{:?}",
            h.reasons
        );
        assert!(h.describe().contains("DISTORTED"));
        // exactly at the bound is still healthy
        let edge: Vec<(f64, f64)> = (0..10)
            .map(|i| {
                if i == 0 {
                    (2_500.0, 9_000.0)
                } else {
                    (2_500.0, 2_500.0)
                }
            })
            .collect();
        assert_eq!(judge(&m(&edge, Some(0), None)).verdict, "ok");
    }

    #[test]
    fn a_late_part_is_named() {
        let rtts = [(10_000.0, 10_100.0)];
        let mut stats = RunStats {
            engine: Default::default(),
            datapath: Default::default(),
        };
        stats.datapath.late_p99_ns = 3_500_000;
        let h = judge(&m(&rtts, Some(2_400), Some(&stats)));
        assert_eq!(h.verdict, "distorted");
        assert_eq!(h.reasons.len(), 2, "{:?}", h.reasons);
        assert!(h.reasons[0].starts_with("connection starts p99 2.4 ms late"));
        assert!(h.reasons[1].starts_with("emulator departures p99 3.5 ms late"));
        assert_eq!(h.departure_late_p99_us, Some(3_500));
        // little stolen: not named
        assert_eq!((h.stolen_ms, h.cause.as_deref()), (Some(120), None));
        assert!(!h.describe().contains("hypervisor"));
    }

    #[test]
    fn a_distorted_replay_on_a_host_whose_hypervisor_took_the_cpu_names_it() {
        let rtts = [(10_000.0, 10_100.0)];
        let mut mm = m(&rtts, Some(4_300), None);
        mm.stolen = Some((3_900.0, 0.0466));
        let h = judge(&mm);
        // a note, not a criterion: the reasons are the lateness alone
        assert_eq!(h.verdict, "distorted");
        assert_eq!(h.reasons.len(), 1, "{:?}", h.reasons);
        assert_eq!(h.stolen_ms, Some(3_900));
        let d = h.describe();
        assert!(
            d.contains("the hypervisor took 4.7% of the host's CPU time during the replay"),
            "{d}"
        );
        // the same steal beside a healthy replay says nothing
        mm.start_late_p99_us = Some(300);
        let h = judge(&mm);
        assert_eq!((h.verdict, h.cause), ("ok", None));
        // the bound itself is named; just under it is not
        assert!(steal_note("distorted", Some(STOLEN_NOTE)).is_some());
        assert!(steal_note("distorted", Some(STOLEN_NOTE - 1e-6)).is_none());
        assert!(steal_note("distorted", None).is_none());
    }

    #[test]
    fn stolen_time_is_a_share_of_every_cpus_time() {
        // (what steal_now read earlier) 1 s stolen over 10 s on 2 CPUs: 5%; nothing before
        // gives nothing
        let now = steal_now().expect("/proc/stat");
        let (ms, share) = stolen_since(
            Some((now.0 - 1_000.0, 2)),
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        assert!((999.0..1_100.0).contains(&ms), "{ms}");
        assert!((share - ms / 20_000.0).abs() < 1e-12, "{share}");
        assert_eq!(stolen_since(None, std::time::Duration::from_secs(1)), None);
    }

    #[test]
    fn nothing_measured_is_not_judged() {
        let h = judge(&Measured {
            rtts: &[],
            rtt_judged: false,
            start_late_p99_us: None,
            server: None,
            netemu: None,
            load: None,
            stolen: None,
        });
        assert_eq!(h.verdict, "not judged");
        assert_eq!(h.rtt_agree, None);
        assert!(h.describe().contains("min RTT not judged"));
    }
}
