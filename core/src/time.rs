//! Capture time.
//!
//! Everything inside mimic carries time as a [`Timestamp`]: signed nanoseconds since the Unix
//! epoch. Trace formats (µs / ns / pcapng `if_tsresol`) are converted when a frame is read, and
//! the database stores microseconds; both conversions live here.

use std::fmt;

/// Nanoseconds since 1970-01-01T00:00:00Z. Signed, so differences and pre-epoch values are
/// representable; the range is roughly years 1678–2262.
#[derive(
    Copy,
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    #[inline]
    pub const fn from_nanos(ns: i64) -> Self {
        Timestamp(ns)
    }
    #[inline]
    pub const fn from_micros(us: i64) -> Self {
        Timestamp(us.saturating_mul(1_000))
    }
    #[inline]
    pub const fn from_millis(ms: i64) -> Self {
        Timestamp(ms.saturating_mul(1_000_000))
    }
    pub fn from_secs_f64(s: f64) -> Self {
        Timestamp((s * 1e9).round() as i64)
    }
    /// Seconds plus a fraction in `units_per_sec`, or `None` when the result does not fit.
    #[inline]
    pub fn from_parts(secs: i64, frac: u64, units_per_sec: u64) -> Option<Self> {
        // every capture's common case in 64-bit arithmetic (a 128-bit division is a library
        // call): a fraction below one second of at most nanosecond resolution, whose
        // nanoseconds (below 10^18) fit; the same value as the general case below
        if frac < units_per_sec && units_per_sec <= 1_000_000_000 {
            let sub = match units_per_sec {
                1_000_000_000 => frac,
                1_000_000 => frac * 1_000,
                u => frac * 1_000_000_000 / u,
            };
            if let Some(ns) = secs
                .checked_mul(1_000_000_000)
                .and_then(|ns| ns.checked_add(sub as i64))
            {
                return Some(Timestamp(ns));
            }
        }
        Self::from_parts_wide(secs, frac, units_per_sec)
    }
    fn from_parts_wide(secs: i64, frac: u64, units_per_sec: u64) -> Option<Self> {
        if units_per_sec == 0 {
            return None;
        }
        let ns =
            (secs as i128) * 1_000_000_000 + (frac as i128) * 1_000_000_000 / units_per_sec as i128;
        i64::try_from(ns).ok().map(Timestamp)
    }
    #[inline]
    pub const fn as_nanos(self) -> i64 {
        self.0
    }
    /// Whole microseconds (floor), the unit the database stores.
    #[inline]
    pub const fn as_micros(self) -> i64 {
        self.0.div_euclid(1_000)
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// `self - earlier` in nanoseconds (negative if `earlier` is later).
    #[inline]
    pub const fn nanos_since(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
    /// `self - earlier` in microseconds, rounded to nearest.
    #[inline]
    pub fn micros_since(self, earlier: Timestamp) -> i64 {
        let d = self.nanos_since(earlier);
        (d + d.signum() * 500) / 1_000
    }
    #[inline]
    pub const fn add_nanos(self, ns: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ns))
    }
    #[inline]
    pub const fn add_micros(self, us: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(us.saturating_mul(1_000)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}",
            self.0.div_euclid(1_000_000_000),
            self.0.rem_euclid(1_000_000_000)
        )
    }
}

/// Durations are plain signed nanoseconds; these helpers keep unit conversions in one place.
pub mod dur {
    pub const US: i64 = 1_000;
    pub const MS: i64 = 1_000_000;
    pub const SEC: i64 = 1_000_000_000;
    /// Rounds nanoseconds to the nearest microsecond.
    #[inline]
    pub fn ns_to_us(ns: i64) -> i64 {
        (ns + ns.signum() * 500) / 1_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 64-bit common case gives what the 128-bit arithmetic gives, at the edges of both.
    #[test]
    fn parts_fast_path_equals_the_wide_arithmetic() {
        let secs = [
            i64::MIN,
            i64::MIN / 1_000_000_000 - 1,
            i64::MIN / 1_000_000_000,
            -1,
            0,
            1,
            1_700_000_000,
            u32::MAX as i64,
            i64::MAX / 1_000_000_000,
            i64::MAX / 1_000_000_000 + 1,
            i64::MAX,
        ];
        let units: [u64; 9] = [
            1,
            10,
            1_000,
            1_000_000,
            1 << 20,
            999_999_999,
            1_000_000_000,
            1 << 30,
            1 << 40,
        ];
        for &s in &secs {
            for &u in &units {
                for frac in [0, 1, u / 2, u.saturating_sub(1), u, u + 1, u64::MAX] {
                    assert_eq!(
                        Timestamp::from_parts(s, frac, u),
                        Timestamp::from_parts_wide(s, frac, u),
                        "{s} {frac}/{u}"
                    );
                }
            }
        }
        assert_eq!(Timestamp::from_parts(5, 3, 0), None);
    }

    #[test]
    fn parts_conversions() {
        assert_eq!(
            Timestamp::from_parts(1, 5, 1_000_000),
            Some(Timestamp::from_nanos(1_000_005_000))
        );
        assert_eq!(
            Timestamp::from_parts(1, 5, 1_000_000_000),
            Some(Timestamp::from_nanos(1_000_000_005))
        );
        // a microsecond field of exactly one million carries into the next second
        assert_eq!(
            Timestamp::from_parts(1, 1_000_000, 1_000_000),
            Some(Timestamp::from_nanos(2_000_000_000))
        );
        // year 586524 does not fit in i64 nanoseconds
        assert_eq!(Timestamp::from_parts(18_000_000_000_000, 0, 1), None);
        // post-2106 fits
        assert!(Timestamp::from_parts(4_294_967_296 + 100, 0, 1).is_some());
    }

    #[test]
    fn micros() {
        assert_eq!(Timestamp::from_nanos(1_499).as_micros(), 1);
        assert_eq!(Timestamp::from_nanos(-1).as_micros(), -1);
        assert_eq!(
            Timestamp::from_nanos(2_600).micros_since(Timestamp::from_nanos(1_000)),
            2
        );
        assert_eq!(
            Timestamp::from_nanos(1_000_000_123).to_string(),
            "1.000000123"
        );
    }
}
