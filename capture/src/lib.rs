//! The capture node: packet sources, consistent connection sampling, payload policy, keyed
//! prefix-preserving anonymization, rotating pcapng output with drop accounting.
//!
//! * [`key`] — the secret key file shared by sampling and anonymization.
//! * [`sample`] — keyed (SipHash) or last-octet connection sampling, direction-free.
//! * [`anon`] — Crypto-PAn for IPv4/IPv6, MAC pseudonyms, in-place rewrite with checksums.
//! * [`process`] — the per-packet pipeline (decode, sample, cut, anonymize), pure.
//! * [`pcapng`], [`output`] — pcapng blocks and the rotating `.part`-then-rename writer.
//! * [`source`] — file, libpcap live and (feature `dpdk`) DPDK sources.
//! * [`capture`] — threads, stop conditions, statistics: what `mimic capture` runs.
//! * [`spec`] — the role's launch contract: [`CaptureSpec`] (settings, command line, `run`)
//!   and the `capture.ready` / `capture-summary.json` files it writes and callers read.

pub mod anon;
pub mod capture;
pub mod key;
pub mod layers;
pub mod output;
pub mod pcapng;
pub mod process;
pub mod sample;
pub mod source;
pub mod spec;

pub use capture::{run_capture, CaptureConfig, CaptureProbe, CaptureSummary, StopReason, Totals};
pub use key::CaptureKey;
pub use process::{NonTcp, PayloadPolicy, Settings};
pub use sample::{Rate, Rule};
pub use spec::{CaptureRunError, CaptureSpec};
