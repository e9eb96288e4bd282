//! Parsing of the human units used in pipe and stack specifications: durations (`20ms`),
//! rates (`10mbit`), sizes (`64kb`) and probabilities (`1%`). Every parser returns a message
//! that names the offending text; callers add the key and the file.

use std::borrow::Cow;

/// Nanoseconds, the one time unit inside the engine.
pub type Nanos = u64;

/// The most characters of an input an error message quotes whole: a spec with every key set
/// is under 200.
const QUOTE_MAX_CHARS: usize = 200;
/// How much of a longer input a message quotes.
const QUOTE_HEAD_CHARS: usize = 80;

/// Input text as an error message quotes it: whole up to 200 characters, else its first 80
/// and its length (`delay=1ms,xxx… (5000010 bytes)`), so that a file or a runaway variable
/// read as a spec gives a message of one line, not a copy of itself. Every message that
/// quotes a pipe spec, a value in one or a line of a pipe table goes through here.
pub fn quote(s: &str) -> Cow<'_, str> {
    if s.char_indices().nth(QUOTE_MAX_CHARS).is_none() {
        return Cow::Borrowed(s);
    }
    let head = s
        .char_indices()
        .nth(QUOTE_HEAD_CHARS)
        .map_or(s.len(), |(i, _)| i);
    Cow::Owned(format!("{}… ({} bytes)", &s[..head], s.len()))
}

fn split_num(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    let v: f64 = s[..end].parse().ok()?;
    if !v.is_finite() {
        return None;
    }
    Some((v, s[end..].trim()))
}

/// Splits a `KEY=VALUE,KEY=VALUE` specification into trimmed pairs, in order; empty parts are
/// ignored, a part without `=` and a key given twice are refused.
pub fn key_values(spec: &str) -> Result<Vec<(&str, &str)>, String> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{}` is not KEY=VALUE", quote(part)))?;
        let (k, v) = (k.trim(), v.trim());
        if pairs.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("`{}` is given twice", quote(k)));
        }
        pairs.push((k, v));
    }
    Ok(pairs)
}

/// `20ms`, `1.5ms`, `250us`, `250µs`, `100ns`, `2s`. A bare number is refused: the unit is
/// never guessed.
pub fn parse_duration(s: &str) -> Result<Nanos, String> {
    let q = quote(s);
    let (v, unit) =
        split_num(s).ok_or_else(|| format!("`{q}` is not a duration (e.g. 20ms, 250us, 1s)"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "ns" => 1.0,
        "us" | "µs" | "usec" => 1e3,
        "ms" | "msec" => 1e6,
        "s" | "sec" => 1e9,
        "" => return Err(format!("`{q}` has no unit (write e.g. {q}ms)")),
        u => {
            return Err(format!(
                "`{q}`: unknown time unit `{}` (use ns, us, ms or s)",
                quote(u)
            ))
        }
    };
    let ns = v * mult;
    if ns > 3_600e9 {
        return Err(format!("`{q}` is longer than an hour"));
    }
    Ok(ns.round() as Nanos)
}

/// Formats nanoseconds in the largest unit that keeps it exact (`20ms`, `1500us`, `7ns`).
pub fn fmt_duration(ns: Nanos) -> String {
    if ns == 0 {
        "0ms".into()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// Rates in bits per second: `10mbit`, `1.5Mbit/s`, `100kbit`, `1gbit`, `64000bit`, or bytes
/// per second with `byte` units (`1mbyte` = 8 Mbit/s). Prefixes are decimal (k = 1000), as in
/// tc and dummynet. `unlimited` (or `none`, `inf`) means no rate limit (returned as 0); `0`
/// is refused as `0bit` is: a rate of zero would pass nothing, and reading it as "no limit"
/// turns the request into its opposite.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let q = quote(s);
    let t = s.trim().to_ascii_lowercase();
    if t == "none" || t == "unlimited" || t == "inf" {
        return Ok(0);
    }
    if t == "0" {
        return Err(format!(
            "`{q}` is no rate (a pipe of 0 bit/s passes nothing): write `unlimited` for a pipe without a rate limit"
        ));
    }
    let (v, unit) =
        split_num(&t).ok_or_else(|| format!("`{q}` is not a rate (e.g. 10mbit, 512kbit)"))?;
    let unit = unit
        .strip_suffix("/s")
        .or_else(|| unit.strip_suffix("ps"))
        .map(|u| (u, true))
        .unwrap_or((unit, false));
    let (unit, per_s) = unit;
    let (prefix, base) = if let Some(p) = unit.strip_suffix("bit") {
        (p, 1.0)
    } else if let Some(p) = unit.strip_suffix("byte") {
        (p, 8.0)
    } else if per_s && unit.ends_with('b') {
        return Err(format!(
            "`{q}` is ambiguous (bits or bytes?): write e.g. 10mbit or 1mbyte"
        ));
    } else if unit.is_empty() {
        return Err(format!("`{q}` has no unit (write e.g. {q}mbit)"));
    } else {
        return Err(format!(
            "`{q}`: unknown rate unit (use bit, kbit, mbit, gbit or kbyte, mbyte)"
        ));
    };
    let mult = match prefix {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        p => {
            return Err(format!(
                "`{q}`: unknown prefix `{}` (use k, m, g)",
                quote(p)
            ))
        }
    };
    let bps = v * mult * base;
    if bps < 1.0 {
        return Err(format!(
            "`{q}` is below 1 bit/s (`unlimited` is a pipe without a rate limit)"
        ));
    }
    if bps > MAX_RATE_BPS {
        return Err(format!("`{q}` is above 10 Tbit/s"));
    }
    Ok(bps.round() as u64)
}

/// The fastest rate a pipe takes (and a replay takes from a database): 10 Tbit/s, past any link
/// a capture could have measured, well within a pipe's u64 bit rate.
pub const MAX_RATE_BPS: f64 = 1e13;

/// Formats bits per second compactly and exactly (`10mbit`, `1500kbit`, `64001bit`).
pub fn fmt_rate(bps: u64) -> String {
    if bps == 0 {
        "unlimited".into()
    } else if bps.is_multiple_of(1_000_000_000) {
        format!("{}gbit", bps / 1_000_000_000)
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}mbit", bps / 1_000_000)
    } else if bps.is_multiple_of(1_000) {
        format!("{}kbit", bps / 1_000)
    } else {
        format!("{bps}bit")
    }
}

/// Byte sizes: `1500`, `1500b`, `64kb` (1000), `64kib` (1024), `1mb`, `1mib`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let q = quote(s);
    let t = s.trim().to_ascii_lowercase();
    let (v, unit) =
        split_num(&t).ok_or_else(|| format!("`{q}` is not a size (e.g. 64kb, 1500b)"))?;
    let mult = match unit {
        "" | "b" | "byte" | "bytes" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        u => {
            return Err(format!(
                "`{q}`: unknown size unit `{}` (use b, kb, kib, mb, mib)",
                quote(u)
            ))
        }
    };
    Ok((v * mult).round() as u64)
}

/// A probability: `1%`, `0.5%` or a fraction `0.01`, in [0, 1].
pub fn parse_prob(s: &str) -> Result<f64, String> {
    let q = quote(s);
    let t = s.trim();
    let v = if let Some(p) = t.strip_suffix('%') {
        p.trim()
            .parse::<f64>()
            .map_err(|_| format!("`{q}` is not a percentage"))?
            / 100.0
    } else {
        t.parse::<f64>()
            .map_err(|_| format!("`{q}` is not a probability (write e.g. 1% or 0.01)"))?
    };
    if !(0.0..=1.0).contains(&v) || v.is_nan() {
        return Err(format!("`{q}` is not between 0% and 100%"));
    }
    Ok(v)
}

/// Formats a probability as a percentage without losing digits (`1%`, `0.25%`).
pub fn fmt_prob(p: f64) -> String {
    let pct = p * 100.0;
    let s = format!("{pct:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("20ms"), Ok(20_000_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration("250us"), Ok(250_000));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        assert!(parse_duration("20").unwrap_err().contains("no unit"));
        assert!(parse_duration("20parsecs")
            .unwrap_err()
            .contains("unknown time unit"));
        assert!(parse_duration("-1ms").is_err());
        assert_eq!(fmt_duration(20_000_000), "20ms");
        assert_eq!(fmt_duration(1_500_000), "1500us");
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10mbit"), Ok(10_000_000));
        assert_eq!(parse_rate("10Mbit/s"), Ok(10_000_000));
        assert_eq!(parse_rate("1.5mbit"), Ok(1_500_000));
        assert_eq!(parse_rate("1mbyte"), Ok(8_000_000));
        assert_eq!(parse_rate("unlimited"), Ok(0));
        // a bare 0 is no request for "no limit": refused as 0bit is, naming the way to ask
        for zero in ["0", " 0 ", "0bit", "0kbit", "0mbit"] {
            let e = parse_rate(zero).unwrap_err();
            assert!(e.contains("`unlimited`"), "{zero}: {e}");
        }
        assert!(parse_rate("10mbps").unwrap_err().contains("ambiguous"));
        assert!(parse_rate("10").unwrap_err().contains("no unit"));
        assert_eq!(fmt_rate(10_000_000), "10mbit");
        assert_eq!(fmt_rate(1_500_000), "1500kbit");
    }

    #[test]
    fn messages_quote_long_input_by_its_head_and_length() {
        // short input is quoted whole, as typed
        let spec = "delay=1500us,rate=1500kbit,overhead=14,burst=1514,queue=64000b,ge=1%/30%/100%/0%,seed=7,jitter=1ms,first_delay=150ms,reorder=1,ack_every=4,ack_timeout=150ms";
        assert_eq!(quote(spec), spec);
        assert_eq!(quote(""), "");
        let long = format!("delay=1ms,{}", "x".repeat(5_000_000));
        let q = quote(&long);
        assert_eq!(q, format!("delay=1ms,{}… (5000010 bytes)", "x".repeat(70)));
        // cut on a character, never inside one
        let wide = "µ".repeat(300);
        assert_eq!(quote(&wide), format!("{}… (600 bytes)", "µ".repeat(80)));
        // each parser's message quotes the bounded form
        let huge = "7".repeat(1_000_000);
        for e in [
            parse_duration(&huge).unwrap_err(),
            parse_rate(&huge).unwrap_err(),
            parse_prob(&huge).unwrap_err(),
            parse_bytes(&format!("1{huge}q")).unwrap_err(),
            parse_duration(&format!("1{huge}")).unwrap_err(),
            key_values(&format!("a=1,{huge}")).unwrap_err(),
        ] {
            assert!(
                e.len() < 400 && e.contains(" bytes)"),
                "{}",
                &e[..e.len().min(400)]
            );
        }
    }

    #[test]
    fn sizes_and_probabilities() {
        assert_eq!(parse_bytes("64kb"), Ok(64_000));
        assert_eq!(parse_bytes("64KiB"), Ok(65_536));
        assert_eq!(parse_prob("1%"), Ok(0.01));
        assert_eq!(parse_prob("0.25"), Ok(0.25));
        assert!(parse_prob("101%").is_err());
        assert_eq!(fmt_prob(0.01), "1%");
        assert_eq!(fmt_prob(0.0025), "0.25%");
    }
}
