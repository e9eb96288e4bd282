//! `docker/shard-run.sh --ssh` for real: two "hosts", each an sshd (its own config, host key
//! and log, key-only login with a key made here) in a network namespace of this test, reached
//! from here over a veth pair on 198.18.0.0/15. Four shards of public captures run over them,
//! come back by scp, and merge into the unsharded run's database row by row; the Parquet path
//! with `--copy` brings back byte for byte the files a local run of each shard writes; a shard
//! that fails names its host and leaves nothing behind. Namespaces, links and the sshd
//! processes are torn down by a guard however the test ends.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::flowdb::{assert_merged_equals_unsharded, open};
use crate::common::*;

const SSHD: &str = "/usr/sbin/sshd";
const PORT: u16 = 2222;

/// An ssh host in a namespace of its own: its address and the folder it uses as TMPDIR (so
/// the test sees what shard-run.sh leaves there).
struct Host {
    ns: String,
    link: String,
    addr: String,
    tmp: PathBuf,
    log: PathBuf,
    sshd: Option<Child>,
}

/// Two hosts; everything of theirs goes when dropped.
struct Hosts {
    hosts: Vec<Host>,
    /// `MIMIC_SSH` for them: port, the key made here, their host keys only.
    ssh: String,
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut c) = h.sshd.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            // (the peer end goes with the namespace)
            let _ = Command::new("ip")
                .args(["link", "del", &h.link])
                .stderr(Stdio::null())
                .status();
            // a session sshd forked would keep the namespace: none should be left, but
            // end them (they are ours: processes in our namespace)
            if let Ok(o) = Command::new("ip").args(["netns", "pids", &h.ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill has no memory preconditions; the pid is in our namespace.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip")
                .args(["netns", "del", &h.ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
}

/// Starts the two hosts under `dir`.
fn two_hosts(dir: &Path) -> Hosts {
    require_root("sshd in network namespaces");
    assert!(
        Path::new(SSHD).is_file(),
        "{SSHD} is missing (openssh-server): scripts/deps.sh test installs it"
    );
    for t in ["ssh", "scp", "ssh-keygen", "sha256sum", "timeout"] {
        require_tool(t);
    }
    // sshd's privilege separation needs its empty folder (Debian's packaging makes it at boot)
    std::fs::create_dir_all("/run/sshd").unwrap();
    let key = |name: &str| {
        sh(&[
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            name,
            "-f",
            dir.join(name).to_str().unwrap(),
        ]);
    };
    key("host_key");
    key("user_key");
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
    let host_pub: Vec<&str> = host_pub.split_whitespace().take(2).collect();

    let pid = std::process::id();
    // 198.18.NET.0/29 (two /30 links), NET in 100..=199 from the pid, one no route here uses
    // yet (a lab, a container LAN)
    let routes = Command::new("ip")
        .args(["-4", "route", "show"])
        .output()
        .unwrap();
    let routes = stdout(&routes);
    let net = (0..100)
        .map(|i| 100 + (pid + i) % 100)
        .find(|n| !routes.contains(&format!("198.18.{n}.")))
        .expect("every 198.18.100-199.0/24 has a route here: nowhere to put the test's links");
    let mut hosts = Hosts {
        hosts: Vec::new(),
        ssh: String::new(),
    };
    let mut known = String::new();
    for (i, tag) in ["a", "b"].iter().enumerate() {
        let h = Host {
            ns: format!("mssh{pid}{tag}"),
            link: format!("ms{pid}{tag}"),
            addr: format!("198.18.{net}.{}", 4 * i + 2),
            tmp: dir.join(format!("host-{tag}")),
            log: dir.join(format!("sshd-{tag}.log")),
            sshd: None,
        };
        let here = format!("198.18.{net}.{}/30", 4 * i + 1);
        let peer = format!("{}p", h.link);
        std::fs::create_dir(&h.tmp).unwrap();
        // pushed first, so the guard removes whatever part of it exists
        hosts.hosts.push(h);
        let h = hosts.hosts.last_mut().unwrap();
        sh(&["ip", "netns", "add", &h.ns]);
        sh(&[
            "ip", "link", "add", &h.link, "type", "veth", "peer", "name", &peer,
        ]);
        sh(&["ip", "link", "set", &peer, "netns", &h.ns]);
        sh(&["ip", "addr", "add", &here, "dev", &h.link]);
        sh(&["ip", "link", "set", &h.link, "up"]);
        let there = format!("{}/30", h.addr);
        sh(&["ip", "-n", &h.ns, "addr", "add", &there, "dev", &peer]);
        sh(&["ip", "-n", &h.ns, "link", "set", &peer, "up"]);
        sh(&["ip", "-n", &h.ns, "link", "set", "lo", "up"]);
        // a home of its own, empty, as a remote host has: sshd's bash reads ~/.bashrc even
        // for a command, and this host's (a developer's pyenv, say) must not run in the
        // test's sessions (CI once waited 60 s in each for a pyenv lock, and the run timed out)
        let home = dir.join(format!("home-{tag}"));
        std::fs::create_dir(&home).unwrap();
        if *tag == "a" {
            // host a's login shell greets on stdout and stderr, as many do: shard-run.sh must
            // take neither for a version, a folder or a checksum
            std::fs::write(
                home.join(".bashrc"),
                "echo 'welcome to host a (from ~/.bashrc, on stdout)'\n\
                 echo 'host a: a note from ~/.bashrc, on stderr' >&2\n",
            )
            .unwrap();
        }
        let conf = dir.join(format!("sshd-{tag}.conf"));
        std::fs::write(
            &conf,
            format!(
                "ListenAddress {addr}:{PORT}\n\
                 HostKey {dir}/host_key\n\
                 AuthorizedKeysFile {dir}/authorized_keys\n\
                 PidFile none\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 Subsystem sftp internal-sftp\n\
                 SetEnv TMPDIR={tmp} HOME={home}\n",
                addr = h.addr,
                dir = dir.display(),
                tmp = h.tmp.display(),
                home = home.display(),
            ),
        )
        .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &h.ns, SSHD, "-D", "-f"])
            .arg(&conf)
            .arg("-E")
            .arg(&h.log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        h.sshd = Some(child);
        known.push_str(&format!(
            "[{}]:{PORT} {} {}\n",
            h.addr, host_pub[0], host_pub[1]
        ));
    }
    std::fs::write(dir.join("known_hosts"), known).unwrap();
    // both listening (at most 10 s)
    for h in &mut hosts.hosts {
        let to: SocketAddr = format!("{}:{PORT}", h.addr).parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect_timeout(&to, Duration::from_millis(200)).is_ok() {
                break;
            }
            if let Some(st) = h.sshd.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "sshd in {} exited ({st}): {}",
                    h.ns,
                    std::fs::read_to_string(&h.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sshd in {} does not listen on {to} after 10 s: {}",
                h.ns,
                std::fs::read_to_string(&h.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    hosts.ssh = format!(
        "ssh -F /dev/null -p {PORT} -i {key} -o IdentitiesOnly=yes -o UserKnownHostsFile={kh} \
         -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o LogLevel=ERROR",
        key = dir.join("user_key").display(),
        kh = dir.join("known_hosts").display(),
    );
    hosts
}

impl Hosts {
    fn list(&self) -> String {
        self.hosts
            .iter()
            .map(|h| format!("root@{}", h.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `docker/shard-run.sh ARGS` with `MIMIC_SSH` for these hosts, at most 120 s.
    fn shard_run(&self, args: &[&str]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/shard-run.sh");
        Command::new("timeout")
            .args(["-k", "5", "120", "bash"])
            .arg(script)
            .args(args)
            .env("MIMIC_SSH", &self.ssh)
            .env("MIMIC_BIN", mimic_bin())
            .env("MIMIC_REMOTE_BIN", mimic_bin())
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    }

    /// Sessions each sshd accepted with the test's key.
    fn logins(&self) -> Vec<usize> {
        self.hosts
            .iter()
            .map(|h| {
                let mut s = String::new();
                if let Ok(mut f) = std::fs::File::open(&h.log) {
                    f.read_to_string(&mut s).unwrap();
                }
                s.matches("Accepted publickey for root").count()
            })
            .collect()
    }

    /// Whatever shard-run.sh left in the hosts' TMPDIRs (it must leave nothing).
    fn left_on_hosts(&self) -> Vec<PathBuf> {
        self.hosts
            .iter()
            .flat_map(|h| std::fs::read_dir(&h.tmp).unwrap())
            .map(|e| e.unwrap().path())
            .collect()
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Every file under `dir`, relative to it, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn ok_run(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: exit {:?}\n{}{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// The ssh path: 4 shards over two sshd hosts equal the unsharded run, row by row;
/// Parquet with --copy equals each shard run here, byte for byte; a failed shard names its
/// host and writes nothing; the hosts are left clean.
#[test]
fn shard_run_over_ssh_merges_into_the_unsharded_run() {
    let tmp = tempdir();
    let dir = tmp.path();
    let hosts = two_hosts(dir);
    let list = hosts.list();
    let (a, b) = (
        format!("root@{}", hosts.hosts[0].addr),
        format!("root@{}", hosts.hosts[1].addr),
    );
    // two public captures in one folder (more than one input; --copy sends them by name)
    let caps = [
        trace("web/tcptrace_http.dmp.pcap"),
        trace("web/zeek_echo-connections.pcap"),
    ];
    assert_eq!(caps[0].parent(), caps[1].parent());
    let caps: Vec<String> = caps
        .iter()
        .map(|c| c.canonicalize().unwrap().display().to_string())
        .collect();
    let out = dir.join("out");
    std::fs::create_dir(&out).unwrap();

    // SQLite, the captures at the same paths on every host (here a shared file system)
    let full = out.join("full.db");
    let o = mimic()
        .args(["-q", "analyze"])
        .args(&caps)
        .arg("-o")
        .arg(&full)
        .output()
        .unwrap();
    ok_run(&o, "the unsharded analysis");
    let merged = out.join("ssh.db");
    let kept = dir.join("kept");
    let mut args = vec![
        "-n",
        "4",
        "--ssh",
        &list,
        "--keep-shards",
        kept.to_str().unwrap(),
        "-o",
        merged.to_str().unwrap(),
    ];
    args.extend(caps.iter().map(String::as_str));
    let t = Instant::now();
    let o = hosts.shard_run(&args);
    ok_run(&o, "shard-run.sh --ssh");
    eprintln!(
        "4 shards over ssh on 2 hosts: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let e = stderr(&o);
    // the same mimic on both hosts, host a's greetings notwithstanding
    assert!(!e.contains("note:"), "a version note: {e}");
    for (k, h) in [(1, &a), (2, &b), (3, &a), (4, &b)] {
        assert!(
            e.contains(&format!("shard {k}/4 done on {h} in ")),
            "shard {k} not reported done on {h}: {e}"
        );
    }
    let ta = assert_merged_equals_unsharded(&open(&full), &open(&merged), "shard-run.sh --ssh");
    let conns = ta["connections"].len();
    if corpus_present() {
        assert!(
            conns > 500 && ta["exchanges"].len() > 10_000,
            "{conns} connections"
        );
    }
    // the hash split the captures among the shards that came back (not one shard with all)
    let per: Vec<usize> = (1..=4)
        .map(|k| {
            let c = open(&kept.join(format!("shard-{k}.db")));
            c.query_row("SELECT count(*) FROM connections", [], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap() as usize
        })
        .collect();
    assert_eq!(
        per.iter().sum::<usize>(),
        conns,
        "connections per shard {per:?}"
    );
    assert!(
        per.iter().filter(|&&n| n > 0).count() >= 3,
        "connections per shard {per:?}"
    );
    // both sshds let the test's key in (the shards really ran there), and nothing is left
    // on the hosts or beside the output
    let logins = hosts.logins();
    assert!(logins.iter().all(|&n| n >= 3), "logins per host {logins:?}");
    assert_eq!(hosts.left_on_hosts(), Vec::<PathBuf>::new());
    assert_eq!(entries(&out), ["full.db", "ssh.db"]);
    eprintln!(
        "merged over ssh equals the unsharded run: {conns} connections (per shard {per:?}), {} exchanges; sshd logins {logins:?}",
        ta["exchanges"].len()
    );

    // Parquet, the captures copied to each host first (--copy: by file name there, so here
    // each shard is run in the captures' folder by name for the same meta `inputs`)
    let pq = out.join("flows.parquet");
    let mut args = vec![
        "-n",
        "4",
        "--ssh",
        &list,
        "--copy",
        "--format",
        "parquet",
        "-o",
        pq.to_str().unwrap(),
    ];
    args.extend(caps.iter().map(String::as_str));
    let o = hosts.shard_run(&args);
    ok_run(&o, "shard-run.sh --ssh --copy --format parquet");
    assert!(
        stderr(&o).contains("captures copied to 2 host(s), SHA-256 checked"),
        "{}",
        stderr(&o)
    );
    let capdir = Path::new(&caps[0]).parent().unwrap();
    let names: Vec<&str> = caps
        .iter()
        .map(|c| Path::new(c).file_name().unwrap().to_str().unwrap())
        .collect();
    let local = dir.join("local.parquet");
    for k in 1..=4 {
        let o = mimic()
            .current_dir(capdir)
            .args(["-q", "analyze"])
            .args(&names)
            .args(["--shard", &format!("{k}/4"), "--format", "parquet", "-o"])
            .arg(&local)
            .output()
            .unwrap();
        ok_run(&o, &format!("local shard {k}/4"));
    }
    let (got, want) = (files_under(&pq), files_under(&local));
    assert_eq!(got, want, "the dataset's files");
    let tables: Vec<String> = entries(&pq);
    for t in [
        "connections",
        "exchanges",
        "rtt_samples",
        "bw_samples",
        "meta",
    ] {
        assert!(tables.contains(&format!("table={t}")), "{tables:?}");
    }
    assert_eq!(got.len(), tables.len() * 4, "{got:?}");
    let mut same = 0;
    for f in &got {
        // meta holds the run's own times and command line; every other table is the same bytes
        if f.starts_with("table=meta") {
            continue;
        }
        assert!(
            std::fs::read(pq.join(f)).unwrap() == std::fs::read(local.join(f)).unwrap(),
            "{} differs from the local run's",
            f.display()
        );
        same += 1;
    }
    assert_eq!(hosts.left_on_hosts(), Vec::<PathBuf>::new());
    eprintln!("parquet over ssh (--copy): {same} files equal to the local shards' byte for byte");

    // a shard that fails (the mimic on the hosts refuses shard 2/4): named with its host, the
    // others stopped, no output, nothing left here or there
    let failing = dir.join("failing-mimic");
    std::fs::write(
        &failing,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = 2/4 ] && {{ echo 'refusing shard 2/4 on purpose' >&2; exit 3; }}; done\nexec {} \"$@\"\n",
            mimic_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bad = out.join("bad.db");
    let mut args = vec![
        "-n",
        "4",
        "--ssh",
        &list,
        "--remote-mimic",
        failing.to_str().unwrap(),
        "-o",
        bad.to_str().unwrap(),
    ];
    args.extend(caps.iter().map(String::as_str));
    let o = hosts.shard_run(&args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&format!("shard 2/4 failed on {b} (exit 3)")),
        "{e}"
    );
    assert!(e.contains("refusing shard 2/4 on purpose"), "{e}");
    assert!(e.contains("nothing written"), "{e}");
    assert!(!bad.exists());
    assert_eq!(entries(&out), ["flows.parquet", "full.db", "ssh.db"]);
    assert_eq!(hosts.left_on_hosts(), Vec::<PathBuf>::new());

    // Ctrl-C while the shards run on the hosts (their mimic sleeps instead): exit 130 at once,
    // the remote processes stopped, no output, the hosts' folders gone
    let marker = format!("86.{}", std::process::id());
    let slow = dir.join("slow-mimic");
    std::fs::write(
        &slow,
        format!(
            "#!/bin/sh\n[ \"$1\" = -q ] && exec sleep {marker}\nexec {} \"$@\"\n",
            mimic_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let sleeping = || {
        let o = Command::new("pgrep")
            .args(["-f", &format!("^sleep {marker}$")])
            .output()
            .unwrap();
        stdout(&o).split_whitespace().count()
    };
    let mut cmd = Command::new("bash");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/shard-run.sh"))
        .args(["-n", "4", "--ssh", &list, "--remote-mimic"])
        .arg(&slow)
        .arg("-o")
        .arg(&bad)
        .args(&caps)
        .env("MIMIC_SSH", &hosts.ssh)
        .env("MIMIC_BIN", mimic_bin())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SIGINT as at a terminal: a test run started in the background of a non-interactive
    // shell (`.ci/run &`, nohup) has it ignored, a child inherits that, and a shell that
    // starts with a signal ignored cannot trap it (POSIX): shard-run.sh would never hear the
    // Ctrl-C (two CI-mode runs failed here so, 20 s without a word from it)
    sigint_as_at_a_terminal(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sleeping() < 2 {
        assert!(
            Instant::now() < deadline,
            "the two slow shards did not start on the hosts in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            // what was still running, and what the script said, so that a hang names its step
            let ps = Command::new("ps")
                .args(["-eo", "pid,pgid,ppid,stat,etime,args"])
                .output()
                .unwrap();
            let tree: Vec<&str> = std::str::from_utf8(&ps.stdout)
                .unwrap_or("")
                .lines()
                .filter(|l| l.contains("shard-run") || l.contains("ssh") || l.contains(&marker))
                .collect();
            let _ = child.kill();
            let _ = child.wait();
            // (a process it left may hold the pipe: read for at most 5 s)
            let mut pipe = child.stderr.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut e = String::new();
                let _ = pipe.read_to_string(&mut e);
                let _ = tx.send(e);
            });
            let e = rx
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_else(|_| "(the pipe stayed open)".into());
            panic!(
                "shard-run.sh did not stop within 20 s of SIGINT; its stderr:\n{e}\nprocesses then:\n{}",
                tree.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut e = String::new();
    child.stderr.take().unwrap().read_to_string(&mut e).unwrap();
    assert_eq!(status.code(), Some(130), "{e}");
    assert!(e.contains("interrupted"), "{e}");
    assert_eq!(sleeping(), 0, "remote shards still running after Ctrl-C");
    assert!(!bad.exists());
    assert_eq!(hosts.left_on_hosts(), Vec::<PathBuf>::new());
    assert_eq!(entries(&out), ["flows.parquet", "full.db", "ssh.db"]);
    eprintln!(
        "Ctrl-C: stopped in {:.1} s, remote shards and folders gone",
        t.elapsed().as_secs_f64()
    );

    // a host without sshd (this side of the first link: connection refused) is named before
    // any shard runs
    let nohost = format!("root@{}", {
        let a = &hosts.hosts[0].addr;
        let (net, last) = a.rsplit_once('.').unwrap();
        format!("{net}.{}", last.parse::<u8>().unwrap() - 1)
    });
    let mut args = vec!["-n", "2", "--ssh", &nohost, "-o", bad.to_str().unwrap()];
    args.extend(caps.iter().map(String::as_str));
    let o = hosts.shard_run(&args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains(&format!("host {nohost}: cannot run")), "{e}");
    assert!(e.contains("nothing run"), "{e}");
    assert!(!bad.exists());

    // arguments refused with the reason, before any host is asked
    let cap0 = caps[0].as_str();
    let bad_s = bad.to_str().unwrap();
    let pq_s = pq.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--copy", "-o", bad_s, cap0],
            "--copy copies the captures to the --ssh hosts",
        ),
        (
            vec!["--ssh", "h1,,h2", "-o", bad_s, cap0],
            "an empty host name",
        ),
        (
            vec!["-n", "0", "--ssh", "h1", "-o", bad_s, cap0],
            "-n must be a positive number",
        ),
        (
            vec!["--ssh", "h1", "-o", bad_s, cap0, "--", "--shard", "1/2"],
            "is shard-run.sh's to set",
        ),
        (
            vec!["--ssh", "h1", "--format", "parquet", "-o", pq_s, cap0],
            "is not empty",
        ),
        (
            vec!["--ssh", "h1", "--copy", "-o", bad_s, cap0, cap0],
            "two captures are named",
        ),
        (
            vec!["--ssh", "h1", "-o", bad_s, "/nonexistent.pcap"],
            "/nonexistent.pcap: no such file",
        ),
        (
            vec!["--format", "csv", "-o", bad_s, cap0],
            "--format must be sqlite or parquet",
        ),
    ] {
        let o = hosts.shard_run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(want),
            "{args:?}: want {want:?}: {}",
            stderr(&o)
        );
        assert!(!bad.exists());
    }
    assert_eq!(entries(&out), ["flows.parquet", "full.db", "ssh.db"]);
}
