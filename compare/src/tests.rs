//! Report-level tests over databases written here with the real schema.

use std::path::{Path, PathBuf};

use mimic_core::db::{set_meta, AtomicDb};

use crate::*;

pub(crate) struct Conn {
    pub id: i64,
    pub rt_us: Option<i64>,
    pub min_rtt_us: Option<i64>,
    pub bw_bps: Option<f64>,
    pub loss: Option<f64>,
}

pub(crate) struct MapRow {
    pub orig: i64,
    pub replay: Option<i64>,
    pub status: &'static str,
    pub failure: Option<&'static str>,
}

/// Writes a mimic database with `conns` (one exchange each when it has a response time) and
/// an optional replay_map.
pub(crate) fn write_db(
    path: &Path,
    role: &str,
    meta: &[(&str, &str)],
    conns: &[Conn],
    map: &[MapRow],
) {
    let db = AtomicDb::create(path).unwrap();
    let c = db.conn();
    set_meta(c, "role", role).unwrap();
    for (k, v) in meta {
        set_meta(c, k, v).unwrap();
    }
    for x in conns {
        c.execute(
            "INSERT INTO connections (id, client_ip, client_port, server_ip, server_port, ip_version, t_first, t_end,
               complete, prune_reason, server_by, min_rtt_us, bw_bps, loss_rate_down, termination, exchanges, response_time_us)
             VALUES (?1, '198.18.0.2', ?2, '198.19.0.2', 80, 4, 1000, 2000, ?3, ?4, 'syn', ?5, ?6, ?7, 'fin', ?8, ?9)",
            rusqlite::params![
                x.id,
                10000 + x.id,
                x.rt_us.is_some() as i64,
                if x.rt_us.is_some() { None } else { Some("no_response") },
                x.min_rtt_us,
                x.bw_bps,
                x.loss,
                x.rt_us.is_some() as i64,
                x.rt_us
            ],
        )
        .unwrap();
        if let Some(rt) = x.rt_us {
            c.execute(
                "INSERT INTO exchanges (conn_id, seq, req_bytes, resp_bytes, response_delay_us, query_delay_us) VALUES (?1, 0, 300, 5000, ?2, ?3)",
                rusqlite::params![x.id, rt / 10, rt / 5],
            )
            .unwrap();
        }
    }
    for m in map {
        c.execute(
            "INSERT INTO replay_map (orig_conn_id, replay_conn_id, status, failure) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![m.orig, m.replay, m.status, m.failure],
        )
        .unwrap();
    }
    db.commit().unwrap();
}

/// splitmix64 → uniform (0,1).
struct Gen(u64);
impl Gen {
    fn u(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        (((z ^ (z >> 31)) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// A workload of `n` originals with response times from 50 ms to 300 ms.
pub(crate) fn originals(n: i64, seed: u64) -> Vec<Conn> {
    let mut g = Gen(seed);
    (1..=n)
        .map(|id| {
            let rtt = [5_000, 20_000, 80_000, 200_000][(id % 4) as usize];
            let bw = [56e3, 1e6, 10e6, 100e6][((id / 4) % 4) as usize];
            // log-uniform 50 … 150 ms, stretched by the RTT (up to 2×): smooth, right-skewed
            let rt = (50_000.0 * 3f64.powf(g.u()) * (1.0 + rtt as f64 / 200_000.0)) as i64;
            Conn {
                id,
                rt_us: if id % 50 == 0 { None } else { Some(rt) },
                min_rtt_us: Some(rtt),
                bw_bps: if id % 7 == 0 { None } else { Some(bw) },
                loss: Some(if id % 10 == 0 { 0.02 } else { 0.0 }),
            }
        })
        .collect()
}

pub(crate) struct Fixture {
    pub _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub replay: PathBuf,
    pub faster: PathBuf,
    pub same: PathBuf,
}

/// BASE (original, 400 connections, 8 without a response time), a replay of it (ids shifted
/// by 1000, relative error (id % 39 − 19)/100 up to rounding, 3 failed: 2 timeout + 1 refused, one
/// missing, one ok without a response time), a 25%-faster original and an identical one.
pub(crate) fn fixture() -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("mimic-compare-")
        .tempdir()
        .unwrap();
    let base = dir.path().join("original.db");
    let orig = originals(400, 7);
    write_db(&base, "original", &[], &orig, &[]);

    let replay = dir.path().join("replay.db");
    let mut conns = Vec::new();
    let mut map = Vec::new();
    for o in &orig {
        let rid = o.id + 1000;
        match o.id {
            3 | 4 => map.push(MapRow {
                orig: o.id,
                replay: None,
                status: "failed",
                failure: Some("timeout"),
            }),
            5 => map.push(MapRow {
                orig: o.id,
                replay: None,
                status: "failed",
                failure: Some("refused"),
            }),
            6 => map.push(MapRow {
                orig: o.id,
                replay: None,
                status: "missing",
                failure: None,
            }),
            7 => {
                conns.push(Conn {
                    id: rid,
                    rt_us: None,
                    min_rtt_us: o.min_rtt_us,
                    bw_bps: o.bw_bps,
                    loss: o.loss,
                });
                map.push(MapRow {
                    orig: o.id,
                    replay: Some(rid),
                    status: "ok",
                    failure: None,
                });
            }
            _ => {
                let err = ((o.id % 39) - 19) as f64 / 100.0;
                let rt = o.rt_us.map(|v| (v as f64 * (1.0 + err)).round() as i64);
                conns.push(Conn {
                    id: rid,
                    rt_us: rt,
                    min_rtt_us: o.min_rtt_us,
                    bw_bps: o.bw_bps,
                    loss: o.loss,
                });
                map.push(MapRow {
                    orig: o.id,
                    replay: Some(rid),
                    status: "ok",
                    failure: None,
                });
            }
        }
    }
    write_db(
        &replay,
        "replay",
        &[("stack_profile", "initcwnd=10,cc=cubic")],
        &conns,
        &map,
    );

    let faster = dir.path().join("faster.db");
    let f: Vec<Conn> = originals(400, 7)
        .into_iter()
        .map(|c| Conn {
            rt_us: c.rt_us.map(|v| v * 3 / 4),
            ..c
        })
        .collect();
    write_db(&faster, "original", &[], &f, &[]);
    let same = dir.path().join("same.db");
    write_db(&same, "original", &[], &originals(400, 7), &[]);
    Fixture {
        _dir: dir,
        base,
        replay,
        faster,
        same,
    }
}

fn opts() -> Options {
    Options {
        bootstrap_replicates: 500,
        ..Options::default()
    }
}

#[test]
fn paired_relative_error_and_failures() {
    let f = fixture();
    let r = Report::build(&f.base, std::slice::from_ref(&f.replay), &opts()).unwrap();
    assert_eq!(r.inputs[0].connections, 400);
    assert_eq!(r.inputs[0].with_response_time, 392);
    assert_eq!(r.inputs[0].excluded.len(), 1);
    assert_eq!(r.inputs[0].excluded[0].count, 8);
    let p = r.comparisons[0]
        .paired
        .as_ref()
        .expect("replay of BASE is paired");
    assert_eq!(p.replay_map_rows, 400);
    // every replayed connection with a counterpart agrees except id 7 (no exchange in the replay)
    assert_eq!(
        (p.consistent + 1, p.consistency_checked),
        (p.consistency_checked, 396)
    );
    // expected pairs: ids with an original response time, minus 3..=7
    let expected: Vec<f64> = (1..=400i64)
        .filter(|id| id % 50 != 0 && !(3..=7).contains(id))
        .map(|id| {
            let o = originals(400, 7)
                .into_iter()
                .find(|c| c.id == id)
                .unwrap()
                .rt_us
                .unwrap() as f64;
            let rep = (o * (1.0 + ((id % 39) - 19) as f64 / 100.0)).round();
            (rep - o) / o
        })
        .collect();
    assert_eq!(p.pairs, expected.len());
    let w10 =
        expected.iter().filter(|e| e.abs() <= 0.10 + 1e-12).count() as f64 / expected.len() as f64;
    let w20 =
        expected.iter().filter(|e| e.abs() <= 0.20 + 1e-12).count() as f64 / expected.len() as f64;
    assert!(
        (p.overall.within_10 - w10).abs() < 1e-12,
        "{} vs {w10}",
        p.overall.within_10
    );
    assert!((p.overall.within_20 - w20).abs() < 1e-12);
    assert!(w20 > 0.99 && w10 < 0.6, "fixture shape: {w10} {w20}");
    // failures are reported by status and reason, never dropped
    let count = |status: &str, reason: &str| {
        p.unpaired
            .iter()
            .find(|u| u.status == status && u.reason == reason)
            .map(|u| u.count)
    };
    assert_eq!(count("failed", "timeout"), Some(2));
    assert_eq!(count("failed", "refused"), Some(1));
    assert_eq!(count("missing", "no reason recorded"), Some(1));
    assert_eq!(
        count("ok", "replayed connection has no response time"),
        Some(1)
    );
    // originals without response time that were replayed (ids 50, 100, …) are "ok" but unpairable
    assert_eq!(
        count("ok", "original connection has no response time"),
        Some(8)
    );
    // breakdowns: 4 RTT values → one class each; bandwidth 4 values + unknown
    let by = |name: &str| p.breakdowns.iter().find(|b| b.by == name).unwrap();
    assert_eq!(by("min_rtt").classes.len(), 4);
    assert_eq!(by("bandwidth").classes.len(), 5);
    assert_eq!(by("bandwidth").classes.last().unwrap().label, "unknown");
    assert_eq!(by("response_time").classes.len(), 4, "quartile classes");
    let total: usize = by("response_time").classes.iter().map(|c| c.n).sum();
    assert_eq!(total, p.pairs);
    assert!(
        by("min_rtt").classes[0].label.contains("5 ms"),
        "{}",
        by("min_rtt").classes[0].label
    );
}

#[test]
fn verdicts_faster_and_no_difference() {
    let f = fixture();
    let r = Report::build(&f.base, &[f.faster.clone(), f.same.clone()], &opts()).unwrap();
    let faster = &r.comparisons[0];
    assert!(
        faster.verdict.contains("faster is faster"),
        "{}",
        faster.verdict
    );
    assert!(
        faster.verdict.contains("the distributions differ"),
        "{}",
        faster.verdict
    );
    let p50 = faster.rows.iter().find(|r| r.stat == "p50").unwrap();
    assert!((p50.rel + 0.25).abs() < 0.01, "{}", p50.rel);
    assert!(p50.rel_ci[0] < p50.rel && p50.rel < p50.rel_ci[1]);
    assert_eq!(p50.direction, Direction::Faster);
    let same = &r.comparisons[1];
    assert!(
        same.verdict
            .contains("no significant difference at p50 or p90"),
        "{}",
        same.verdict
    );
    assert!(
        same.verdict.contains("KS finds no significant difference"),
        "{}",
        same.verdict
    );
    assert_eq!(same.ks.d, 0.0);
    assert!(same
        .rows
        .iter()
        .all(|r| r.direction == Direction::NotSignificant));
    assert!(same.paired.is_none() && same.pairing_note.is_none());
    assert_eq!(r.verdict().lines().count(), 2);
}

#[test]
fn reproducible_with_a_seed() {
    let f = fixture();
    let a = Report::build(&f.base, std::slice::from_ref(&f.faster), &opts())
        .unwrap()
        .to_json();
    let b = Report::build(&f.base, std::slice::from_ref(&f.faster), &opts())
        .unwrap()
        .to_json();
    assert_eq!(a, b);
    let c = Report::build(
        &f.base,
        std::slice::from_ref(&f.faster),
        &Options { seed: 99, ..opts() },
    )
    .unwrap()
    .to_json();
    assert_ne!(a["comparisons"][0]["rows"], c["comparisons"][0]["rows"]);
}

#[test]
fn a_replay_of_something_else_is_not_paired() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("foreign.db");
    let conns = originals(10, 3)
        .into_iter()
        .map(|c| Conn {
            id: c.id + 5000,
            ..c
        })
        .collect::<Vec<_>>();
    let map: Vec<MapRow> = (1..=10)
        .map(|i| MapRow {
            orig: i + 90_000,
            replay: Some(i + 5000),
            status: "ok",
            failure: None,
        })
        .collect();
    write_db(&foreign, "replay", &[], &conns, &map);
    let r = Report::build(&f.base, &[foreign], &opts()).unwrap();
    assert!(r.comparisons[0].paired.is_none());
    let note = r.comparisons[0].pairing_note.as_deref().unwrap();
    assert!(
        note.contains("10 of its 10 rows") && note.contains("not a replay of original"),
        "{note}"
    );
    // ids that exist in BASE, but connections that do not match theirs (exchange counts differ)
    let lookalike = dir.path().join("lookalike.db");
    let conns = originals(20, 5)
        .into_iter()
        .map(|c| Conn {
            id: c.id + 5000,
            ..c
        })
        .collect::<Vec<_>>();
    let map: Vec<MapRow> = (1..=20)
        .map(|i| MapRow {
            orig: i,
            replay: Some(i + 5000),
            status: "ok",
            failure: None,
        })
        .collect();
    write_db(&lookalike, "replay", &[], &conns, &map);
    rusqlite::Connection::open(&lookalike)
        .unwrap()
        .execute("UPDATE connections SET exchanges = 3", [])
        .unwrap();
    let r = Report::build(&f.base, &[lookalike], &opts()).unwrap();
    assert!(r.comparisons[0].paired.is_none());
    let note = r.comparisons[0].pairing_note.as_deref().unwrap();
    assert!(
        note.contains("only 0 of 20 replayed connections")
            && note.contains("does not look like a replay"),
        "{note}"
    );
    // a replay as BASE: no pairing either, and it says why
    let r = Report::build(&f.replay, std::slice::from_ref(&f.replay), &opts()).unwrap();
    assert!(r.comparisons[0]
        .pairing_note
        .as_deref()
        .unwrap()
        .contains("itself a replay"));
}

#[test]
fn bad_inputs_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture();
    let text = dir.path().join("notes.db");
    std::fs::write(&text, "hello, not a database").unwrap();
    let e = Report::build(&text, std::slice::from_ref(&f.base), &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("notes.db") && e.contains("not an SQLite database"),
        "{e}"
    );

    let empty = dir.path().join("empty.db");
    write_db(&empty, "original", &[], &[], &[]);
    let e = Report::build(&f.base, std::slice::from_ref(&empty), &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("empty.db") && e.contains("empty input") && e.contains("no connections"),
        "{e}"
    );

    let no_rt = dir.path().join("nort.db");
    write_db(
        &no_rt,
        "original",
        &[],
        &[Conn {
            id: 1,
            rt_us: None,
            min_rtt_us: None,
            bw_bps: None,
            loss: None,
        }],
        &[],
    );
    let e = Report::build(&no_rt, std::slice::from_ref(&f.base), &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nort.db") && e.contains("none of its 1 connections has a response time"),
        "{e}"
    );

    let e = Report::build(&f.base, &[dir.path().join("absent.db")], &opts())
        .unwrap_err()
        .to_string();
    assert!(e.contains("absent.db") && e.contains("no such file"), "{e}");

    let e = Report::build(
        &f.base,
        &[],
        &Options {
            bootstrap_replicates: 10,
            ..opts()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bootstrap"), "{e}");
}

/// A connection row with a value no reader can take (text that is not UTF-8, written by hand)
/// is a corrupt record: left out and counted, named in the report, the rest compared.
#[test]
fn a_damaged_connection_row_is_left_out_and_named() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let damaged = dir.path().join("damaged.db");
    std::fs::copy(&f.base, &damaged).unwrap();
    let c = rusqlite::Connection::open(&damaged).unwrap();
    c.execute(
        "UPDATE connections SET client_ip = CAST(X'31302EFF2E302E31' AS TEXT) WHERE id IN (3, 5)",
        [],
    )
    .unwrap();
    drop(c);
    let r = Report::build(&f.base, std::slice::from_ref(&damaged), &opts()).unwrap();
    let (base, other) = (&r.inputs[0], &r.inputs[1]);
    assert_eq!(other.connections, base.connections);
    assert_eq!(other.with_response_time, base.with_response_time - 2);
    let left = other
        .excluded
        .iter()
        .find(|e| e.reason.starts_with("damaged ("))
        .unwrap_or_else(|| panic!("{:?}", other.excluded));
    assert_eq!(left.count, 2);
    assert_eq!(
        left.reason,
        "damaged (a value no reader can take, e.g. connection with id = 3: client_ip holds \
         text that is not UTF-8: '10.\\xff.0.1')"
    );
    assert!(
        r.to_text().contains("2 damaged (a value"),
        "{}",
        r.to_text()
    );
    assert_eq!(r.comparisons.len(), 1);

    // a replay still pairs with its BASE when rows of either are damaged: those connections
    // are unpaired for that reason, the rest paired as before
    let before = Report::build(&f.base, std::slice::from_ref(&f.replay), &opts()).unwrap();
    let pairs_before = before.comparisons[0].paired.as_ref().unwrap().pairs;
    let damage = |db: &Path, ids: &str| {
        rusqlite::Connection::open(db)
            .unwrap()
            .execute(
                &format!(
                    "UPDATE connections SET server_ip = CAST(X'FF' AS TEXT) WHERE id IN ({ids})"
                ),
                [],
            )
            .unwrap()
    };
    assert_eq!(damage(&f.base, "10, 11"), 2);
    assert_eq!(damage(&f.replay, "1012"), 1);
    let r = Report::build(&f.base, std::slice::from_ref(&f.replay), &opts()).unwrap();
    let c = &r.comparisons[0];
    assert_eq!(c.pairing_note, None);
    let p = c.paired.as_ref().expect("still paired");
    assert_eq!(p.pairs, pairs_before - 3);
    let count = |reason: &str| {
        p.unpaired
            .iter()
            .find(|u| u.status == "ok" && u.reason == reason)
            .map(|u| u.count)
    };
    assert_eq!(
        count("original connection's row is damaged (left out of original)"),
        Some(2),
        "{:?}",
        p.unpaired
    );
    assert_eq!(
        count("replayed connection's row is damaged (left out)"),
        Some(1),
        "{:?}",
        p.unpaired
    );

    // a replay_map row with such a value is unpaired under a status of its own, by column
    let pairs_before = p.pairs;
    rusqlite::Connection::open(&f.replay)
        .unwrap()
        .execute(
            "UPDATE replay_map SET status = CAST(X'6FFF' AS TEXT) WHERE orig_conn_id IN (20, 21)",
            [],
        )
        .unwrap();
    let r = Report::build(&f.base, std::slice::from_ref(&f.replay), &opts()).unwrap();
    let p = r.comparisons[0].paired.as_ref().expect("still paired");
    assert_eq!(p.pairs, pairs_before - 2);
    let damaged: Vec<_> = p
        .unpaired
        .iter()
        .filter(|u| u.status == "damaged")
        .map(|u| (u.reason.as_str(), u.count))
        .collect();
    assert_eq!(
        damaged,
        [("status holds a value no reader can take (a damaged row)", 2)]
    );
}

#[test]
fn json_has_everything() {
    let f = fixture();
    let r = Report::build(&f.base, &[f.replay.clone(), f.faster.clone()], &opts()).unwrap();
    let j = r.to_json();
    assert_eq!(j["format"], "mimic-compare/1");
    assert_eq!(j["inputs"].as_array().unwrap().len(), 3);
    assert_eq!(j["inputs"][1]["role"], "replay");
    assert_eq!(
        j["inputs"][1]["meta"]["stack_profile"],
        "initcwnd=10,cc=cubic"
    );
    assert_eq!(
        j["inputs"][0]["response_time_us"]["quantiles"]
            .as_array()
            .unwrap()
            .len(),
        101
    );
    assert_eq!(j["inputs"][0]["excluded"][0]["count"], 8);
    for key in [
        "min_rtt_us",
        "bw_bps",
        "loss_rate_down",
        "response_delay_us",
        "query_delay_us",
    ] {
        assert!(
            j["inputs"][0]["population"][key]["n"].as_u64().unwrap() > 0,
            "{key}"
        );
    }
    assert_eq!(j["inputs"][0]["population"]["bw_bps"]["missing"], 57);
    let c = &j["comparisons"][0];
    assert_eq!(c["rows"].as_array().unwrap().len(), 8);
    assert_eq!(c["rows"][7]["stat"], "mean");
    assert!(c["rows"][2]["rel_ci"].as_array().unwrap().len() == 2);
    assert!(c["ks"]["p_value"].as_f64().is_some() && c["ks"]["method"] == "exact");
    assert!(c["paired"]["overall"]["within_20"].as_f64().unwrap() > 0.99);
    assert_eq!(c["paired"]["breakdowns"].as_array().unwrap().len(), 3);
    assert!(j["comparisons"][1]["paired"].is_null());
    assert_eq!(j["verdict"].as_array().unwrap().len(), 2);
    assert_eq!(j["options"]["bootstrap_replicates"], 500);
}

#[test]
fn fail_if_against_a_report() {
    let f = fixture();
    let r = Report::build(&f.base, std::slice::from_ref(&f.faster), &opts()).unwrap();
    assert!(FailIf::parse("p50 < -20%").unwrap().holds(&r));
    assert!(!FailIf::parse("p50 < -30%").unwrap().holds(&r));
    assert!(!FailIf::parse("p90 > +5%").unwrap().holds(&r));
    assert!(FailIf::parse("mean <= -1ms").unwrap().holds(&r));
    let o = FailIf::parse("median < -20%").unwrap().evaluate(&r);
    assert_eq!(o.len(), 1);
    assert!(
        o[0].explanation.starts_with("p50 \u{2212}25"),
        "{}",
        o[0].explanation
    );
    // any OTHER makes it hold
    let r = Report::build(&f.base, &[f.same.clone(), f.faster.clone()], &opts()).unwrap();
    let o = FailIf::parse("p50 < -20%").unwrap().evaluate(&r);
    assert_eq!((o[0].holds, o[1].holds), (false, true));
    assert!(FailIf::parse("p50 < -20%").unwrap().holds(&r));
}

/// Under --confidence a replay of BASE is judged on a paired interval (connections resampled
/// together), far narrower than the unpaired one of the same statistic.
#[test]
fn gate_on_a_replay_of_base_is_paired() {
    let f = fixture();
    let r = Report::build(&f.base, std::slice::from_ref(&f.replay), &opts()).unwrap();
    let (pairs, how) = r.pairs(1).unwrap();
    assert_eq!(pairs.len(), r.comparisons[0].paired.as_ref().unwrap().pairs);
    assert_eq!(how, "replay replays original's connections");
    let (paired, n, _) = r.paired_difference(1, Some(50.0), 0.95).unwrap();
    let unpaired = r.difference(1, Some(50.0), 0.95);
    assert_eq!(n, pairs.len());
    let width = |d: &StatDiff| d.rel_ci[1] - d.rel_ci[0];
    assert!(
        width(&paired) < width(&unpaired) / 2.0,
        "{paired:?} {unpaired:?}"
    );
    let o = &FailIf::parse("p50 > +20%")
        .unwrap()
        .with_confidence(Some(0.95))
        .evaluate(&r)[0];
    assert!(!o.holds, "{o:?}");
    assert_eq!(o.paired.as_deref(), Some(how.as_str()));
    assert!(
        o.explanation
            .contains(&format!("paired over {n} connections")),
        "{}",
        o.explanation
    );
    // an independent capture is not paired
    let r = Report::build(&f.base, std::slice::from_ref(&f.faster), &opts()).unwrap();
    assert!(r.pairs(1).is_none());
    let o = &FailIf::parse("p50 < -10%")
        .unwrap()
        .with_confidence(Some(0.95))
        .evaluate(&r)[0];
    assert!(o.holds && o.paired.is_none(), "{o:?}");
    assert!(o.explanation.contains("unpaired"), "{}", o.explanation);
}

#[test]
fn html_is_self_contained_and_png_renders() {
    let f = fixture();
    let r = Report::build(&f.base, &[f.replay.clone(), f.faster.clone()], &opts()).unwrap();
    let html = r.to_html();
    assert!(html.starts_with("<!DOCTYPE html>"));
    // 1 response-time CDF + 3 relative-error plots + 5 population plots
    assert_eq!(html.matches("<svg ").count(), 9);
    for needle in ["<script", "<link", "@import", "url(http", "src="] {
        assert!(!html.contains(needle), "{needle} in the report");
    }
    let external: Vec<&str> = html
        .match_indices("http")
        .map(|(i, _)| &html[i..(i + 40).min(html.len())])
        .filter(|s| !s.starts_with("http://www.w3.org/2000/svg"))
        .collect();
    assert!(external.is_empty(), "{external:?}");
    let dir = tempfile::tempdir().unwrap();
    let files = r.write_pngs(&dir.path().join("png")).unwrap();
    assert_eq!(files.len(), 9);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(
            bytes.len() > 20_000,
            "{} is suspiciously small",
            f.display()
        );
    }
}

#[test]
fn vantage_points_that_differ_or_are_unknown_are_warned_about() {
    use crate::report::vantage_warning;
    let w = |b: Option<&str>, o: Option<&str>| vantage_warning(("orig", b), ("rep", o));
    assert_eq!(w(Some("server"), Some("server")), None);
    assert_eq!(w(Some("client"), Some("client")), None);
    // a synth workload was never captured
    assert_eq!(w(None, Some("client")), None);
    let d = w(Some("server"), Some("client")).unwrap();
    assert!(
        d.starts_with("orig was captured at the server, rep at the client: response times measured at a client include about one more round trip"),
        "{d}"
    );
    let u = w(Some("unknown"), Some("unknown")).unwrap();
    assert!(
        u.starts_with("orig was captured at an unknown point, rep at an unknown point"),
        "{u}"
    );

    // read from meta: a synth database says nothing and is not warned about; a capture
    // without the row is unknown
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let conns = originals(100, 3);
    write_db(&p("synth.db"), "synth", &[], &conns, &[]);
    write_db(&p("old.db"), "original", &[], &conns, &[]);
    write_db(
        &p("client.db"),
        "original",
        &[("capture_vantage", "client")],
        &conns,
        &[],
    );
    let opts = Options {
        bootstrap_replicates: 100,
        ..Options::default()
    };
    let r = Report::build(&p("synth.db"), &[p("client.db"), p("old.db")], &opts).unwrap();
    let v: Vec<Option<&str>> = r
        .inputs
        .iter()
        .map(|i| i.capture_vantage.as_deref())
        .collect();
    assert_eq!(v, [None, Some("client"), Some("unknown")]);
    assert!(r.comparisons.iter().all(|c| c.vantage_warning.is_none()));
    assert!(!r.to_html().contains("Vantage point:"));
    let r = Report::build(&p("client.db"), &[p("old.db")], &opts).unwrap();
    assert!(r
        .to_html()
        .contains("<p class=\"warn\">Vantage point: client was captured at the client, old at an unknown point"));
    assert!(r.comparisons[0].vantage_warning.as_deref().is_some_and(
        |w| w.starts_with("client was captured at the client, old at an unknown point")
    ));
}

#[test]
fn a_replay_whose_timing_was_distorted_is_warned_about() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("healthy.db");
    let bad = dir.path().join("loaded.db");
    std::fs::copy(&f.replay, &ok).unwrap();
    std::fs::copy(&f.replay, &bad).unwrap();
    let c = rusqlite::Connection::open(&ok).unwrap();
    set_meta(&c, "timing_health", "ok").unwrap();
    drop(c);
    let c = rusqlite::Connection::open(&bad).unwrap();
    set_meta(&c, "timing_health", "distorted").unwrap();
    set_meta(
        &c,
        "timing_health_detail",
        r#"{"verdict":"distorted","reasons":["min RTT as configured for only 56.4% of 165 connections"]}"#,
    )
    .unwrap();
    drop(c);
    let r = Report::build(&f.base, &[ok.clone(), bad.clone()], &opts()).unwrap();
    assert_eq!(r.comparisons[0].timing_warning, None);
    let w = r.comparisons[1].timing_warning.as_deref().unwrap();
    assert!(
        w.starts_with("the replay's own timing was distorted in loaded (min RTT as configured for only 56.4% of 165 connections)"),
        "{w}"
    );
    // the connection-by-connection A/B of the two replays carries it too, and it is said once
    assert_eq!(r.ab.len(), 1);
    assert_eq!(r.ab[0].timing_warning.as_deref(), Some(w));
    assert_eq!(r.warnings().iter().filter(|x| x.as_str() == w).count(), 1);
    assert!(r.to_text().contains(&format!("  warning: {w}")));
    assert!(r
        .to_html()
        .contains("<p class=\"warn\">Replay timing: the replay"));
    assert_eq!(
        r.to_json()["comparisons"][1]["timing_warning"].as_str(),
        Some(w)
    );
    // the likely cause the replay named (the hypervisor's steal) follows its reasons
    let c = rusqlite::Connection::open(&bad).unwrap();
    set_meta(
        &c,
        "timing_health_detail",
        r#"{"verdict":"distorted","reasons":["server delays p99 3.7 ms late (at most 2 ms expected)"],"stolen_share":0.0466,"cause":"the hypervisor took 4.7% of the host's CPU time during the replay (steal), the likely cause"}"#,
    )
    .unwrap();
    drop(c);
    let r = Report::build(&f.base, std::slice::from_ref(&bad), &opts()).unwrap();
    let w = r.comparisons[0].timing_warning.as_deref().unwrap();
    assert!(
        w.starts_with("the replay's own timing was distorted in loaded (server delays p99 3.7 ms late (at most 2 ms expected); the hypervisor took 4.7% of the host's CPU time during the replay (steal), the likely cause)"),
        "{w}"
    );
    // healthy replays alone: no warning anywhere
    let r = Report::build(&f.base, &[ok], &opts()).unwrap();
    assert!(r.comparisons[0].timing_warning.is_none() && !r.to_html().contains("Replay timing:"));
    assert!(!r
        .warnings()
        .iter()
        .any(|x| x.contains("timing was distorted")));
}

/// A response time no capture gives (an edited row: 9223372036854775807 µs, which made the
/// report say "p50 +2937239315591440%") is left out and counted under a reason of its own;
/// one over an hour that the connection's own exchanges span (a connection kept busy that
/// long) is kept.
#[test]
fn implausible_response_times_are_left_out_and_counted() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let edited = dir.path().join("edited.db");
    std::fs::copy(&f.base, &edited).unwrap();
    let c = rusqlite::Connection::open(&edited).unwrap();
    c.execute_batch(
        "UPDATE connections SET response_time_us = 9223372036854775807 WHERE id = 1;
         -- two hours, and its exchanges span them
         UPDATE connections SET response_time_us = 7200000000 WHERE id = 2;
         UPDATE exchanges SET t_req_first = 1000, t_resp_last = 7200001000 WHERE conn_id = 2;
         -- over an hour, but its exchanges span a second
         UPDATE connections SET response_time_us = 5000000000 WHERE id = 3;
         UPDATE exchanges SET t_req_first = 1000, t_resp_last = 1001000 WHERE conn_id = 3;
         -- exchanges whose timestamps overflow the span (REAL in SQL) are read, not an error
         UPDATE connections SET response_time_us = 4000000000 WHERE id = 4;
         UPDATE exchanges SET t_req_first = -9223372036854775807, t_resp_last = 9223372036854775807 WHERE conn_id = 4;",
    )
    .unwrap();
    drop(c);
    let r = Report::build(&f.base, std::slice::from_ref(&edited), &opts()).unwrap();
    let (b, e) = (&r.inputs[0], &r.inputs[1]);
    assert_eq!(e.with_response_time, b.with_response_time - 2);
    let x = e
        .excluded
        .iter()
        .find(|x| x.reason.starts_with("implausible response time"))
        .unwrap_or_else(|| panic!("{:?}", e.excluded));
    assert_eq!(x.count, 2);
    assert!(
        x.reason
            .contains("e.g. connection 1: 9223372036854775807 µs")
            && x.reason.contains("a damaged or edited database"),
        "{}",
        x.reason
    );
    assert_eq!(r.response_times_us(1).last(), Some(&7.2e9));
    // the rest compares as it is: the same workload, no absurd difference
    let p50 = r.comparisons[0]
        .rows
        .iter()
        .find(|d| d.stat == "p50")
        .unwrap();
    assert!(p50.rel.abs() < 0.05, "{p50:?}");
    assert!(r.to_json()["inputs"][1]["excluded"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["reason"]
            .as_str()
            .unwrap()
            .starts_with("implausible response time")));
    // an input with no other response time is empty, and says why
    let all = dir.path().join("all.db");
    let mut conns = originals(3, 1);
    for c in &mut conns {
        c.rt_us = Some(i64::MAX);
    }
    write_db(&all, "original", &[], &conns, &[]);
    let e = Report::build(&all, std::slice::from_ref(&f.base), &opts())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("all.db: empty input: none of its 3 connections has a response time")
            && e.contains("implausible"),
        "{e}"
    );
}

/// A synth workload has no response times (they are what its replays measure): as BASE or as
/// an OTHER it is an error that says so and what to do, not "empty input".
#[test]
fn a_synth_workload_is_refused_saying_why() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let synth = dir.path().join("syn.db");
    let mut conns = originals(20, 3);
    for c in &mut conns {
        c.rt_us = None;
    }
    write_db(&synth, "synth", &[], &conns, &[]);
    for (base, other) in [(&synth, &f.base), (&f.base, &synth)] {
        let e = Report::build(base, std::slice::from_ref(other), &opts())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "{}: a synth workload (meta role = synth) has no response times",
                synth.display()
            )) && e.contains("compare its replays")
                && e.contains(&format!("mimic synth check {} replay.db", synth.display())),
            "{e}"
        );
    }
}

/// The outputs of a run are put in place all or nothing: a failure before the renames (a
/// directory where a file goes, a device that takes no bytes) leaves every earlier file as it
/// was, no temporary file and no directory made for them.
#[test]
fn outputs_are_put_in_place_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let (a, b) = (d.join("a.html"), d.join("b.json"));
    std::fs::write(&a, "old a").unwrap();

    // a directory appears where the second goes after both were rendered
    let mut out = Outputs::new();
    out.add(&a, b"new a").unwrap();
    out.add(&b, b"new b").unwrap();
    std::fs::create_dir(&b).unwrap();
    let e = out.commit().unwrap_err().to_string();
    assert!(e.contains("b.json: is a directory"), "{e}");
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
    assert_eq!(listing(), ["a.html", "b.json"]);
    std::fs::remove_dir(&b).unwrap();

    // a device that takes no bytes: nothing renamed
    if Path::new("/dev/full").exists() {
        let mut out = Outputs::new();
        out.add(&a, b"new a").unwrap();
        out.add(Path::new("/dev/full"), b"bytes").unwrap();
        let e = out.commit().unwrap_err().to_string();
        assert!(e.contains("/dev/full"), "{e}");
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "old a");
        assert_eq!(listing(), ["a.html"]);
    }

    // failing while rendering: the directories made for the outputs go again
    let plots = d.join("new").join("plots");
    let mut out = Outputs::new();
    out.create_dir(&plots).unwrap();
    out.add(&plots.join("x.png"), b"png").unwrap();
    std::fs::create_dir(&b).unwrap();
    assert!(out.add(&b, b"new b").is_err());
    drop(out);
    assert_eq!(listing(), ["a.html", "b.json"]);
    std::fs::remove_dir(&b).unwrap();

    // two outputs of one name: refused, not the last one left
    let mut out = Outputs::new();
    out.add(&b, b"one").unwrap();
    out.add(&b, b"two").unwrap();
    assert!(out.commit().is_err());
    assert_eq!(listing(), ["a.html"]);

    // all rendered: all in place
    let mut out = Outputs::new();
    out.add(&a, b"new a").unwrap();
    out.add(&b, b"new b").unwrap();
    assert_eq!(out.commit().unwrap(), [a.clone(), b.clone()]);
    assert_eq!(std::fs::read_to_string(&a).unwrap(), "new a");
    assert_eq!(std::fs::read_to_string(&b).unwrap(), "new b");
    assert_eq!(listing(), ["a.html", "b.json"]);
}

/// `write_pngs` replaces the plots all or nothing: with a directory where its last plot goes,
/// none is written (it once wrote the other 8 and failed), the earlier ones stay as they
/// were, and no temporary file is left.
#[test]
fn pngs_are_written_all_or_nothing() {
    let f = fixture();
    let r = Report::build(&f.base, &[f.replay.clone(), f.faster.clone()], &opts()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("png");
    std::fs::create_dir(&png).unwrap();
    std::fs::write(png.join("response_time_cdf.png"), "an earlier plot").unwrap();
    let last = r.png_names().pop().unwrap();
    std::fs::create_dir(png.join(&last)).unwrap();
    let e = r.write_pngs(&png).unwrap_err().to_string();
    assert!(e.contains(&last) && e.contains("is a directory"), "{e}");
    let mut left: Vec<String> = std::fs::read_dir(&png)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [last.clone(), "response_time_cdf.png".to_string()]);
    assert_eq!(
        std::fs::read_to_string(png.join("response_time_cdf.png")).unwrap(),
        "an earlier plot"
    );
    // once the way is clear, all of them
    std::fs::remove_dir(png.join(&last)).unwrap();
    assert_eq!(r.write_pngs(&png).unwrap().len(), 9);
    assert_eq!(std::fs::read_dir(&png).unwrap().count(), 9);
}

/// Two OTHERs whose labels differ only where a file name cannot ("r.1", "r_1") get PNGs of
/// their own: the second's once replaced the first's. The names other than the per-replay
/// ones are among those checked before the comparison.
#[test]
fn figure_names_stay_unique_and_known() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let (r1, r2) = (dir.path().join("r.1.db"), dir.path().join("r_1.db"));
    std::fs::copy(&f.replay, &r1).unwrap();
    std::fs::copy(&f.replay, &r2).unwrap();
    let r = Report::build(&f.base, &[r1, r2], &opts()).unwrap();
    let names = r.png_names();
    assert_eq!(names.len(), 1 + 3 + 3 + 5, "{names:?}");
    let unique: std::collections::HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert!(
        names.contains(&"rel_error_r_1_by_min_rtt-2.png".to_string()),
        "{names:?}"
    );
    let fixed = Report::fixed_png_names();
    for n in names.iter().filter(|n| !n.starts_with("rel_error_")) {
        assert!(fixed.contains(n), "{n} is not in fixed_png_names");
    }
    let files = r.write_pngs(&dir.path().join("png")).unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path().join("png")).unwrap().count(),
        files.len()
    );
}
