//! mimic's own emulator on a lab router that is a QEMU guest (`mimic lab up NAME --kernel
//! IMAGE`, `mimic replay --lab NAME` with the default `--emulator mimic`): for the replay the
//! guest's bridge is taken apart, `mimic netemu run` bridges the guest's two NICs in userspace
//! instead (the same binary, read from the host's files), and its control channel listens on
//! TCP at [`GUEST_CONTROL`] on the client-side NIC, which the controller reaches from the lab's
//! client namespace. The role's certificates are copied into the guest's `/run`. When dropped,
//! the emulator is stopped and the guest's bridge restored, so kernel pipes (`--emulator
//! netem`) and `lab exec` work as before.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use mimic_netemu::control::ControlAddr;
use mimic_netemu::datapath::SpinRule;
use mimic_netemu::guest::{self, GuestRecord};
use mimic_netemu::lab::LabInfo;
use mimic_netemu::spec::{Bridge, EmulatorSpec};

use super::ReplayError;

/// The address the guest's emulator listens on for its control channel: on the lab's /24, on
/// the guest's client-side NIC (the client and server are .2 and .1).
pub const GUEST_CONTROL_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
pub const GUEST_CONTROL: &str = "tcp:198.18.0.254:7002";
/// Where the emulator's log goes in the guest.
const GUEST_LOG: &str = "/run/mimic-netemu.log";
const LIMIT: Duration = Duration::from_secs(60);

fn err(e: guest::GuestError) -> ReplayError {
    ReplayError::Role {
        role: "network emulator",
        why: format!("in the router guest: {e}"),
    }
}

/// mimic's emulator running in the router guest; stopped (and the guest's bridge restored)
/// when dropped.
pub(super) struct GuestEmulator {
    rec: Box<GuestRecord>,
    info: LabInfo,
    pid: Option<u32>,
}

impl GuestEmulator {
    /// Starts `mimic netemu run` (`exe`) in the guest `rec` of lab `info`, its control
    /// channel at [`GUEST_CONTROL`].
    pub fn start(
        rec: GuestRecord,
        info: &LabInfo,
        exe: &Path,
    ) -> Result<(GuestEmulator, ControlAddr), ReplayError> {
        let addr: ControlAddr = GUEST_CONTROL.parse().map_err(ReplayError::Invalid)?;
        let mut g = GuestEmulator {
            rec: Box::new(rec),
            info: info.clone(),
            pid: None,
        };
        // the role's certificates, into the guest's own /run (the host's is not shared)
        let pki = info.pki_dir.display().to_string();
        let read = |f: &str| {
            std::fs::read_to_string(info.pki_dir.join(f))
                .map_err(|e| ReplayError::Io(format!("{}/{f}: {e}", pki)))
        };
        let (ca, crt, key) = (read("ca.crt")?, read("netemu.crt")?, read("netemu.key")?);
        g.exec(&[
            "sh",
            "-ec",
            "umask 077; mkdir -p \"$1\"; printf %s \"$2\" > \"$1/ca.crt\"; printf %s \"$3\" > \"$1/netemu.crt\"; printf %s \"$4\" > \"$1/netemu.key\"",
            "sh",
            &pki,
            &ca,
            &crt,
            &key,
        ])?;
        // off the bridge, promiscuous (virtio-net filters frames for other MACs otherwise)
        let (c, s) = (&info.emu_cli_if, &info.emu_srv_if);
        g.exec(&[
            "sh",
            "-ec",
            &format!(
                "ip link set {c} nomaster; ip link set {s} nomaster; ip link set {c} promisc on up; ip link set {s} promisc on up; ip addr replace {GUEST_CONTROL_IP}/24 dev {c}"
            ),
        ])?;
        let mut spec = EmulatorSpec::new(Bridge::Interfaces {
            client_if: c.clone(),
            server_if: s.clone(),
        });
        spec.control = Some(addr.clone());
        spec.pki = Some(info.pki_dir.clone());
        // the guest has one vCPU: a SCHED_FIFO datapath there would starve its kernel's
        // network processing
        spec.rt_priority = 0;
        // and its busy-wait gives way to the guest kernel's forwarding as the load-following
        // rule does (on one vCPU it never spins: netemu::datapath::SpinRule)
        spec.spin_rule = SpinRule::BESIDE_HOSTS;
        let mut cmd = vec![exe.display().to_string(), "-q".into()];
        cmd.extend(
            spec.to_args()
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
        let quoted: Vec<String> = cmd.iter().map(|a| format!("'{a}'")).collect();
        let out = g.exec(&[
            "sh",
            "-ec",
            &format!(
                "setsid {} > {GUEST_LOG} 2>&1 < /dev/null & echo $!",
                quoted.join(" ")
            ),
        ])?;
        g.pid = out.trim().parse().ok();
        Ok((g, addr))
    }

    fn exec(&self, argv: &[&str]) -> Result<String, ReplayError> {
        guest::exec_ok_within(&self.rec, argv, LIMIT).map_err(err)
    }

    /// Whether the emulator still runs in the guest.
    pub fn alive(&self) -> bool {
        match self.pid {
            Some(p) => self.exec(&["kill", "-0", &p.to_string()]).is_ok(),
            None => false,
        }
    }

    /// The last lines of the emulator's log in the guest.
    pub fn log_tail(&self) -> String {
        self.exec(&["tail", "-n", "5", GUEST_LOG])
            .unwrap_or_default()
            .lines()
            .collect::<Vec<_>>()
            .join(" | ")
    }

    fn stop(&mut self) -> Result<(), ReplayError> {
        if let Some(p) = self.pid.take() {
            let p = p.to_string();
            // TERM, then KILL after two seconds
            let _ = self.exec(&[
                "sh",
                "-c",
                &format!("kill {p} 2>/dev/null; for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 {p} 2>/dev/null || exit 0; sleep 0.2; done; kill -9 {p}"),
            ]);
        }
        let (c, s) = (&self.info.emu_cli_if, &self.info.emu_srv_if);
        self.exec(&[
            "sh",
            "-ec",
            &format!(
                "ip addr flush dev {c}; ip link set {c} promisc off; ip link set {s} promisc off; ip link set {c} master br0; ip link set {s} master br0"
            ),
        ])
        .map(|_| ())
    }
}

impl Drop for GuestEmulator {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("restoring the router guest's bridge: {e}");
        }
    }
}
