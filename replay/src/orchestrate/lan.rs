//! The replay LAN's own round trip (`--lan-rtt`). Every replayed packet crosses the router
//! host twice on top of its pipes, so a replayed path's RTT is the original's plus the LAN's:
//! 0.05-0.1 ms through mimic's datapath on a host, 0.6-2.6 ms through a router guest under TCG
//! (this project's VMs). Half of that round trip comes off each direction's pipe delay
//! ([`take_off`]), so the replay's min RTT is the original's again; a delay shorter than
//! half of it becomes 0, and such a path keeps the LAN's RTT.
//!
//! In a lab (`auto`) the round trip is measured before the pipes go in: the minimum of 20
//! pings from the client host to the server through the router, unshaped (no flow rule
//! matches the client host's own address). The minimum, as the analyzer's min RTT is one.

use std::net::IpAddr;
use std::process::Command;

use mimic_netemu::engine::FlowRule;

/// Pings sent to measure the round trip.
const PINGS: &str = "20";

/// The LAN's round trip from network namespace `client_ns` to `server` (µs): the minimum of
/// [`PINGS`] pings 10 ms apart. Errors name what failed (no `ping`, no reply).
pub fn measure(client_ns: &str, server: IpAddr) -> Result<u64, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", client_ns, "ping", "-q", "-n", "-c", PINGS])
        .args(["-i", "0.01", "-W", "1"])
        .arg(server.to_string())
        .output()
        .map_err(|e| format!("ping in {client_ns}: {e} (iputils-ping: scripts/deps.sh)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_min_us(&text).ok_or_else(|| {
        format!(
            "ping {server} from {client_ns}: no round trip in its output ({}{})",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// The minimum of ping's summary line (`rtt min/avg/max/mdev = 0.061/0.080/0.110/0.012 ms`), µs.
fn parse_min_us(ping_output: &str) -> Option<u64> {
    let line = ping_output
        .lines()
        .find(|l| l.starts_with("rtt ") || l.starts_with("round-trip "))?;
    let min: f64 = line
        .split('=')
        .nth(1)?
        .trim()
        .split('/')
        .next()?
        .parse()
        .ok()?;
    (min.is_finite() && min >= 0.0).then(|| (min * 1000.0).round() as u64)
}

/// Takes half of `lan_us` off each direction's delay of every rule (not below 0); the number
/// of rules with a direction shorter than that (their replayed RTT stays above the original's).
pub(super) fn take_off(rules: &mut [FlowRule], lan_us: u64) -> usize {
    let half_ns = lan_us * 1000 / 2;
    let mut short = 0;
    for r in rules {
        if r.up.delay < half_ns || r.down.delay < half_ns {
            short += 1;
        }
        r.up.delay = r.up.delay.saturating_sub(half_ns);
        r.down.delay = r.down.delay.saturating_sub(half_ns);
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_of_pings_summary_is_read_in_microseconds() {
        let out = "PING 198.18.0.1 (198.18.0.1) 56(84) bytes of data.\n\n--- 198.18.0.1 ping statistics ---\n\
                   20 packets transmitted, 20 received, 0% packet loss, time 198ms\n\
                   rtt min/avg/max/mdev = 1.558/2.578/6.423/0.691 ms\n";
        assert_eq!(parse_min_us(out), Some(1558));
        assert_eq!(
            parse_min_us("round-trip min/avg/max = 0.061/0.080/0.110 ms"),
            Some(61)
        );
        // every probe lost: no summary line
        assert_eq!(
            parse_min_us("20 packets transmitted, 0 received, 100% packet loss, time 1900ms\n"),
            None
        );
    }

    #[test]
    fn half_the_round_trip_comes_off_each_direction_and_never_below_zero() {
        let pipe = |delay_ms: u64| mimic_netemu::config::PipeConfig {
            delay: delay_ms * 1_000_000,
            ..Default::default()
        };
        let rule = |ms: u64| FlowRule {
            client: "198.19.0.1:20000".parse().unwrap(),
            server: "198.18.0.1:80".parse().unwrap(),
            up: pipe(ms),
            down: pipe(ms),
        };
        let mut rules = vec![rule(20), rule(0)];
        assert_eq!(
            take_off(&mut rules, 1_600),
            1,
            "the 0 ms path is short of 0.8 ms"
        );
        assert_eq!(
            (rules[0].up.delay, rules[0].down.delay),
            (19_200_000, 19_200_000)
        );
        assert_eq!((rules[1].up.delay, rules[1].down.delay), (0, 0));
        assert_eq!(take_off(&mut rules, 0), 0);
        assert_eq!(rules[0].up.delay, 19_200_000);
    }
}
