//! Processes by pid, from `/proc`: whether one still runs (a zombie, exited but not yet reaped,
//! does not), and its start time, which tells it from a later process given the same pid. The
//! sweeps of what killed runs left behind (temporary databases and Parquet directories, labs)
//! ask here.

/// What `/proc/PID/stat` says of a process that mimic needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Clock ticks after boot at which the process started (`starttime`, the 22nd field).
    pub start_ticks: u64,
    /// A zombie (`Z`) or dead (`X`) process: it has exited.
    pub exited: bool,
}

/// The process `pid`, or `None` when there is none (or `pid` is not a process id).
pub fn stat(pid: i32) -> Option<ProcStat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether process `pid` exists and has not exited. A process whose entry cannot be read for
/// another reason than its absence (`/proc` mounted with `hidepid`, another user's process)
/// counts as running: what a sweep would remove for it is left.
pub fn running(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => parse_stat(&s).is_none_or(|s| !s.exited),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// `/proc/PID/stat`: `PID (COMM) STATE …`, the start time the 22nd field. COMM may hold
/// spaces and parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(stat: &str) -> Option<ProcStat> {
    let mut w = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = w.next()?;
    let start_ticks = w.nth(18)?.parse().ok()?;
    Some(ProcStat {
        start_ticks,
        exited: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis_and_a_zombie_has_exited() {
        let line =
            "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let alive = ProcStat {
            start_ticks: 987654,
            exited: false,
        };
        assert_eq!(parse_stat(line), Some(alive));
        assert_eq!(
            parse_stat(&line.replace(") S ", ") Z ")),
            Some(ProcStat {
                exited: true,
                ..alive
            })
        );
        assert_eq!(parse_stat("4242 (a) S 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
        assert!(running(std::process::id() as i32));
        assert!(!running(0) && !running(-1));
        // a child that has exited and is not yet reaped is a zombie: not running
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while running(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!running(pid));
        assert!(stat(pid).is_some_and(|s| s.exited), "a zombie until reaped");
        child.wait().unwrap();
    }
}
