#!/usr/bin/env python3
"""The independent-truth testbed's Python half (bench/independent.sh drives it).

Subcommands:
  plan          the workload: client classes, one connection per line with its configured
                truth (truth.csv) and its requests (requests.csv); the files nginx serves
  query-server  a small HTTP/1.1 query server (a thread per connection): per request, waits
                the response delay from the request's kernel receive time, writes the header
                part, waits the query delay, writes the rest; logs what it really did
                (server.csv)
  clients       runs the plan's connections from the client namespace: curl and a Python
                http.client client (keep-alive, several requests, think times), each from the
                client address and port the plan gave it, one connection at a time per address
  shaping-check per class, before the workload: ping RTT and a download's goodput through the
                shapers against the configured delay and rate (shaping.json)
  report        joins `mimic analyze`'s flows.db and the replay's replay.db with the truth and
                writes the per-class tables (text, JSON, CSV; atomically)

Only the standard library (Python 3.11, Debian 12's python3).
"""

import argparse
import csv
import http.client
import json
import math
import os
import random
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time

# The eight client classes of issue 18: (name, down bit/s, up bit/s, one-way delay ms, loss).
# Rates are IP-layer bits/s (the shaper counts IP bytes: see independent.sh's stab), as
# mimic's bw_bps is.
CLASSES = [
    ("dialup-56k", 56_000, 33_600, 75, 0.0),
    ("isdn-128k", 128_000, 64_000, 100, 0.0),
    ("dsl-1m-loss", 1_000_000, 256_000, 30, 0.01),
    ("dsl-4m", 4_000_000, 512_000, 20, 0.0),
    ("dsl-6m", 6_000_000, 768_000, 15, 0.0),
    ("cable-12m", 12_000_000, 2_000_000, 10, 0.0),
    ("cable-25m", 25_000_000, 5_000_000, 5, 0.0),
    ("fibre-50m", 50_000_000, 50_000_000, 2, 0.0),
]
QUICK_CLASSES = ["isdn-128k", "dsl-4m"]

SERVER_IP = "198.18.0.1"
# the router's own queueing (p99 of the unshaped RTT during the workload, above the base RTT)
# past which a run is flagged: its paths were slower than their truth. The kept runs of the
# eight-class router guest read 1.5-4.4 ms; one on a host whose TCG ran half as fast, 122 ms.
ROUTER_OWN_QUEUE_MS = 10
NGINX_PORT = 80
QUERY_PORT = 8080
ADDRS_PER_CLASS = 32
# bottleneck queue (packets) per direction and class: (down, up), by downstream rate
QUEUES = {56_000: (20, 10), 128_000: (30, 15), 1_000_000: (50, 20)}
MSS_SEGMENT = 1448  # payload of a full-size segment with timestamps on a 1500-byte MTU
# the shapers (independent.sh's shape): "htb", a token bucket of 100 bytes (its first packet of
# a busy period leaves at once: the analyzer's shaper_lead_down about 1), or "netem-rate", a
# serializing link (about 0). Classes over FAST_SHAPER_ABOVE_BPS downstream get the plan's
# --fast-shaper (netem-rate in the router guest, whose late timers cost htb's sub-packet bucket
# 12% of 25 Mbit/s and 24% of 50 Mbit/s), the others htb.
SHAPERS = ("htb", "netem-rate")
FAST_SHAPER_ABOVE_BPS = 12_000_000


def class_shaper(down, fast_shaper):
    return fast_shaper if down > FAST_SHAPER_ABOVE_BPS else "htb"


def class_addrs(down, a):
    """Client addresses of a class: --fast-addrs for the classes over FAST_SHAPER_ABOVE_BPS
    (where given), else --addrs."""
    return a.fast_addrs if a.fast_addrs and down > FAST_SHAPER_ABOVE_BPS else a.addrs


def queues(down):
    return QUEUES.get(down, (100, 50) if down >= 12_000_000 else (64, 32))


def class_addr(k, h):
    """Client address h (0-based) of class k (0-based): 198.19.(k+1).(h+1)."""
    return f"198.19.{k + 1}.{h + 1}"


def die(msg):
    """An error: one line on stderr, exit 2 (the CLI's convention)."""
    print(f"independent: {msg}", file=sys.stderr)
    sys.exit(2)


def write_atomic(path, text):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_csv_atomic(path, header, rows):
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    write_atomic(path, buf.getvalue())


# ---------------------------------------------------------------------------------------- plan


def cmd_plan(a):
    rng = random.Random(a.seed)
    classes = [c for c in CLASSES if not a.classes or c[0] in a.classes.split(",")]
    if not classes:
        die(f"--classes {a.classes}: no such class")
    # --no-delay: rate-only classes; the delay and loss stay in the file as nominal values
    size_grid = sorted({int(round(1000 * 1.15**i, -1)) for i in range(0, 60)})
    www = a.www
    os.makedirs(www, exist_ok=True)
    used_sizes = set()
    conns, reqs = [], []
    per_class = [a.connections // len(classes)] * len(classes)
    for i in range(a.connections - sum(per_class)):
        per_class[i] += 1
    conn_id = 0
    for (name, down, up, delay, loss), n in zip(classes, per_class):
        k = [c[0] for c in CLASSES].index(name)
        qd_, qu_ = queues(down)
        # responses: a median transfer of ~1.5 s at the class's rate, at least 8 KB, at most
        # 10 s or 2 MB (log-normal), so slow classes still carry multi-segment transfers
        med = max(8_000, min(down * 1.5 / 8, 400_000))
        cap = max(16_000, min(down * 10 / 8, 2_000_000))
        ports = {}
        for j in range(n):
            conn_id += 1
            h = j % class_addrs(down, a)
            addr = class_addr(k, h)
            ports[addr] = ports.get(addr, 20_000 + rng.randrange(0, 2000)) + 1
            r = rng.random()
            client, server = (
                ("curl", "nginx") if r < 0.35 else
                ("python", "nginx") if r < 0.60 else
                ("python", "query") if r < 0.85 else
                ("curl", "query")
            )
            nreq = 1 if rng.random() < 0.5 else rng.randint(2, 4)
            # a connection's requests share the transfer budget, so it does not run for minutes
            tot = 0
            for s in range(nreq):
                size = min(cap, max(300, rng.lognormvariate(math.log(med / nreq), 0.8)))
                if server == "nginx":
                    size = min(size_grid, key=lambda g: abs(g - size))
                    used_sizes.add(size)
                    rd = qd = hdr = 0
                else:
                    size = int(size)
                    rd = int(rng.uniform(0.5, 20) * 1000)
                    if size > 4000 and rng.random() < 0.6:
                        qd = int(rng.lognormvariate(math.log(60_000), 0.9))
                        qd = min(max(qd, 5_000), 400_000)
                        hdr = rng.randint(600, 1400)
                    else:
                        qd, hdr = 0, 0
                # think time before the request (curl sends its URLs back to back)
                think = 0 if (s == 0 or client == "curl") else int(
                    min(3e6, max(20_000, rng.lognormvariate(math.log(300_000), 0.8)))
                )
                reqs.append((conn_id, s, size, rd, qd, hdr, think))
                tot += size
            eff_delay = 0 if a.no_delay else delay
            eff_loss = 0.0 if a.no_delay else loss
            conns.append(
                (conn_id, name, addr, ports[addr], SERVER_IP,
                 NGINX_PORT if server == "nginx" else QUERY_PORT, client, server,
                 down, up, eff_delay, eff_delay, eff_loss, qd_, qu_, nreq, tot, delay, loss,
                 class_shaper(down, a.fast_shaper))
            )
    with open(os.path.join(www, "probe"), "wb") as f:
        f.write(os.urandom(1_000_000))  # the shaper-departure probe's download
    for size in used_sizes:
        p = os.path.join(www, str(size))
        if not os.path.exists(p) or os.path.getsize(p) != size:
            with open(p, "wb") as f:
                f.write(os.urandom(size))
    write_csv_atomic(
        os.path.join(a.out, "truth.csv"),
        ["conn", "class", "client_ip", "client_port", "server_ip", "server_port", "client",
         "server", "rate_down_bps", "rate_up_bps", "delay_down_ms", "delay_up_ms", "loss",
         "queue_down_pkts", "queue_up_pkts", "requests", "resp_body_bytes",
         "nominal_delay_ms", "nominal_loss", "shaper"],
        conns,
    )
    write_csv_atomic(
        os.path.join(a.out, "requests.csv"),
        ["conn", "seq", "body_bytes", "response_delay_us", "query_delay_us", "header_body_bytes",
         "think_us"],
        reqs,
    )
    # the classes in use, for the shell's shaper
    lines = []
    for name, down, up, delay, loss in classes:
        k = [c[0] for c in CLASSES].index(name)
        qd_, qu_ = queues(down)
        lines.append(f"{k + 1} {name} {down} {up} {0 if a.no_delay else delay} "
                     f"{0 if a.no_delay else loss} {qd_} {qu_} {class_addrs(down, a)} "
                     f"{class_shaper(down, a.fast_shaper)}")
    write_atomic(os.path.join(a.out, "classes.txt"), "\n".join(lines) + "\n")


# -------------------------------------------------------------------------------- query server


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python 3.11 lacks the name


def serve_connection(sock, peer, log, lock):
    """One client connection: the kernel's receive time of each request's last bytes
    (SO_TIMESTAMPNS, the clock tcpdump stamps packets with) starts the response delay; the
    header part leaves at that time + the delay asked for (or when the server gets to it, if
    later), the rest after the query delay. What really happened is logged: it is the truth."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    buf, seq = b"", 0
    try:
        while True:
            t_req = None
            while b"\r\n\r\n" not in buf:
                data, anc, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
                if not data:
                    return
                buf += data
                t_req = time.time()
                for level, kind, d in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(d) >= 16:
                        sec, ns = struct.unpack("qq", d[:16])
                        t_req = sec + ns / 1e9
            head, buf = buf.split(b"\r\n\r\n", 1)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(parts) < 2 or not parts[1].startswith("/q?"):
                sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            q = dict(kv.split("=", 1) for kv in parts[1][3:].split("&") if "=" in kv)
            size, rd, qd, hdr = (int(q.get(x, 0)) for x in ("size", "rd", "qd", "hdr"))
            body = b"x" * size
            headers = (f"HTTP/1.1 200 OK\r\nServer: mimic-bench-query\r\nContent-Type: "
                       f"application/octet-stream\r\nContent-Length: {size}\r\n\r\n").encode()
            wait = t_req + rd / 1e6 - time.time()
            if wait > 0:
                time.sleep(wait)
            t_first = time.time()
            if qd and hdr:
                sock.sendall(headers + body[:hdr])
                time.sleep(qd / 1e6)
                t_rest = time.time()
                sock.sendall(body[hdr:])
            else:
                t_rest = t_first
                sock.sendall(headers + body)
            with lock:
                log.writerow([peer[0], peer[1], seq, size, int((t_first - t_req) * 1e6),
                              int((t_rest - t_first) * 1e6) if qd and hdr else 0])
            seq += 1
    except OSError:
        pass
    finally:
        sock.close()


def cmd_query_server(a):
    f = open(a.log, "w", newline="", buffering=1)
    log = csv.writer(f, lineterminator="\n")
    log.writerow(["client_ip", "client_port", "seq", "body_bytes", "response_delay_us",
                  "query_delay_us"])
    lock = threading.Lock()
    srv = socket.create_server((a.addr, a.port), backlog=1024)
    while True:
        sock, peer = srv.accept()
        threading.Thread(target=serve_connection, args=(sock, peer, log, lock),
                         daemon=True).start()


# ------------------------------------------------------------------------------------- clients


def run_python(c, rq, errors):
    conn = http.client.HTTPConnection(c["server_ip"], int(c["server_port"]), timeout=120,
                                      source_address=(c["client_ip"], int(c["client_port"])))
    for r in rq:
        if int(r["think_us"]):
            time.sleep(int(r["think_us"]) / 1e6)
        conn.request("GET", url_path(c, r), headers={"Connection": "keep-alive"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200 or len(data) != int(r["body_bytes"]):
            errors.append(f"conn {c['conn']}: status {resp.status}, {len(data)} bytes")
    conn.close()


def url_path(c, r):
    if c["server"] == "nginx":
        return f"/{r['body_bytes']}"
    return (f"/q?size={r['body_bytes']}&rd={r['response_delay_us']}&qd={r['query_delay_us']}"
            f"&hdr={r['header_body_bytes']}")


RUNNING = set()  # curl processes running now, stopped with the clients on SIGTERM


def run_curl(c, rq):
    args = ["curl", "-sS", "--fail", "--max-time", "120", "--interface", c["client_ip"],
            "--local-port", c["client_port"], "-H", "Connection: keep-alive"]
    for r in rq:
        args += ["-o", "/dev/null", f"http://{c['server_ip']}:{c['server_port']}{url_path(c, r)}"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    RUNNING.add(p)
    try:
        _, err = p.communicate()
    finally:
        RUNNING.discard(p)
    if p.returncode != 0:
        raise RuntimeError(f"curl exit {p.returncode}: {err.strip()[:200]}")


def cmd_clients(a):
    def stop(signum, frame):
        for p in list(RUNNING):
            p.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    truth = list(csv.DictReader(open(os.path.join(a.dir, "truth.csv"))))
    reqs = {}
    for r in csv.DictReader(open(os.path.join(a.dir, "requests.csv"))):
        reqs.setdefault(r["conn"], []).append(r)
    by_addr = {}
    for c in truth:
        by_addr.setdefault(c["client_ip"], []).append(c)
    rng = random.Random(a.seed)
    status = {}
    lock = threading.Lock()
    t0 = time.time()

    def worker(addr, conns, start, gaps):
        time.sleep(start)
        for c, gap in zip(conns, gaps):
            t = time.time()
            errors = []
            try:
                if c["client"] == "curl":
                    run_curl(c, reqs[c["conn"]])
                else:
                    run_python(c, reqs[c["conn"]], errors)
                st = "ok" if not errors else "bad_response: " + errors[0]
            except Exception as e:  # a failed connection is recorded, not fatal
                st = f"failed: {type(e).__name__}: {e}"
            with lock:
                status[c["conn"]] = (st, t - t0, time.time() - t)
            time.sleep(gap)

    threads = []
    for addr, conns in sorted(by_addr.items()):
        start = rng.uniform(0, a.spread)
        gaps = [rng.expovariate(1 / a.gap) for _ in conns]
        th = threading.Thread(target=worker, args=(addr, conns, start, gaps), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    rows = [(k, *status[k]) for k in sorted(status, key=int)]
    write_csv_atomic(os.path.join(a.dir, "clients.csv"),
                     ["conn", "status", "start_s", "duration_s"], rows)
    bad = [r for r in rows if r[1] != "ok"]
    print(f"clients: {len(rows) - len(bad)} of {len(rows)} connections ok in "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    for r in bad[:10]:
        print(f"clients: conn {r[0]}: {r[1]}", file=sys.stderr)


# ---------------------------------------------------------------------------------- departures


def cmd_departures(a):
    """How the shaper really releases packets: the arrival gaps of a backlogged download's
    full-size segments at the client (tcpdump -tt reads the capture), against the link's
    serialization time and against a timer tick grid."""
    p = subprocess.run(["tcpdump", "-r", a.pcap, "-n", "-tt", "--nano", "-q",
                        f"src host {SERVER_IP} and greater 1400"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        die(f"tcpdump -r {a.pcap}: {p.stderr.strip()}")
    ts = [float(l.split()[0]) for l in p.stdout.splitlines() if l.strip()]
    gaps = [(b - x) * 1e3 for x, b in zip(ts, ts[1:])]
    if len(gaps) < 50:
        die(f"{a.pcap}: {len(gaps) + 1} full-size packets, too few to judge the shaper's "
            f"departures")
    ser = 1500 * 8 / a.rate * 1e3  # ms per full-size IP packet
    # gaps while the queue was backlogged: the shaper's own spacing (drop the idle gaps)
    busy = [g for g in gaps if g < 3 * ser]
    tick = a.tick_ms
    # a shaper on a tick releases every packet that came due at once: gaps shorter than half a
    # tick lie within one release (back to back at the LAN's speed, and "on" any grid); the
    # grid is judged on the gaps between releases
    releases = [g for g in busy if g >= 0.5 * tick]
    def on_grid(g):
        r = g % tick
        return min(r, tick - r) <= 0.05 * tick
    doc = dict(rate_bps=a.rate, serialization_ms=ser, packets=len(ts), busy_gaps=len(busy),
               median_gap_ms=pct(busy, 0.5), p10_gap_ms=pct(busy, 0.1),
               p90_gap_ms=pct(busy, 0.9),
               within_5pct_of_serialization=share(sum(abs(g - ser) <= 0.05 * ser for g in busy), len(busy)),
               tick_ms=tick,
               within_one_release=share(len(busy) - len(releases), len(busy)),
               release_gaps=len(releases),
               on_tick_grid=share(sum(on_grid(g) for g in releases), len(releases)),
               on_tick_grid_by_chance=0.1)
    write_atomic(a.out, json.dumps(doc, indent=1) + "\n")
    print(f"shaper departures at {a.rate / 1e6:g} Mbit/s: median gap {doc['median_gap_ms']:.3f} ms "
          f"(serialization {ser:.3f} ms; p10 {doc['p10_gap_ms']:.3f}, p90 {doc['p90_gap_ms']:.3f}), "
          f"{100 * doc['within_5pct_of_serialization']:.0f}% within 5% of it; "
          f"{100 * doc['within_one_release']:.0f}% within one release (< {tick / 2:g} ms), "
          f"{fmt_pct(doc['on_tick_grid'])} of the gaps between releases on a {tick:g} ms grid "
          f"(+-5%; 10% by chance)",
          file=sys.stderr)


# ------------------------------------------------------------------------------- shaping check

# a check passes when the ping RTT is within max(10%, 2 ms) of 2 x delay + the base RTT and the
# goodput within 10% of the rate's payload share (less the loss). The RTT compared is the
# pings' minimum, as the base RTT and the truth's RTT are minimums: their average adds the
# router's jitter, which under TCG on a host half as fast as the one these checks were set on
# reached 2.2 ms at 25 Mbit/s (minimum 1.0 ms over).
CHECK_RTT_TOL = (0.10, 2.0)
# where the shapers run in a TCG guest (router.txt says "(tcg)"), netem's delay leaves on a
# timer that fires late by a different amount for each packet: the minimum of 20 pings through
# 5 ms each way came back 1.1-2.4 ms over 2 x delay + base in this host's runs, so there the ms
# part is 3 (a delay left out or doubled is still off by 4 ms or more in every class)
CHECK_RTT_TOL_TCG_MS = 3.0
CHECK_GOODPUT_TOL = 0.10


def cmd_shaping_check(a):
    """Runs in the client namespace. Per class, from its first client address: 20 pings to the
    server (htb lets an isolated packet through at once, so the RTT is 2 x the one-way delay +
    the base RTT), and a download from nginx of about 3 s at the class's downstream rate (at
    least 30 kB), whose goodput after the first byte is compared with the rate's payload share
    (1448 of 1500 IP bytes), less the configured loss. Upstream rate is not probed."""
    base_us = float(open(os.path.join(a.dir, "base_rtt_us")).read().strip())
    lo, hi = (int(x) for x in a.ports.split("-"))
    rp = os.path.join(a.dir, "router.txt")
    tcg = os.path.exists(rp) and "(tcg)" in open(rp).read()
    tol_ms = CHECK_RTT_TOL_TCG_MS if tcg else CHECK_RTT_TOL[1]
    rows = []
    for n, line in enumerate(l for l in open(os.path.join(a.dir, "classes.txt")) if l.strip()):
        k, name, down, up, delay, loss = line.split()[:6]
        # classes.txt of captures before the shaper column: every class was htb
        shaper = (line.split()[9:10] or ["htb"])[0]
        down, delay, loss = int(down), float(delay), float(loss)
        addr = f"198.19.{k}.1"
        p = subprocess.run(["ping", "-q", "-n", "-c", "20", "-i", "0.05", "-W", "3", "-I", addr,
                            SERVER_IP], capture_output=True, text=True)
        sent = got = 0
        rtt = {}
        for l in p.stdout.splitlines():
            if "packets transmitted" in l:
                f = l.split(",")
                sent, got = int(f[0].split()[0]), int(f[1].split()[0])
            if l.startswith("rtt") or l.startswith("round-trip"):
                v = [float(x) for x in l.split("=")[1].split()[0].split("/")]
                rtt = dict(min=v[0], avg=v[1], max=v[2], mdev=v[3])
        want_rtt = 2 * delay + base_us / 1000
        size = int(max(30_000, min(down * 3 / 8, 24_000_000)))
        fname = f"shaping-check-{size}"
        path = os.path.join(a.www, fname)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(os.urandom(size))
        c = subprocess.run(["curl", "-sS", "--fail", "-o", "/dev/null", "--max-time", "60",
                            "--interface", addr, "--local-port", f"{lo + n}-{hi}", "-w",
                            "%{size_download} %{time_starttransfer} %{time_total}",
                            f"http://{SERVER_IP}:{NGINX_PORT}/{fname}"],
                           capture_output=True, text=True)
        goodput = None
        if c.returncode == 0:
            got_bytes, t0, t1 = (float(x) for x in c.stdout.split())
            if t1 > t0:
                goodput = got_bytes * 8 / (t1 - t0)
        want_gp = down * MSS_SEGMENT / 1500 * (1 - loss)
        rtt_ok = bool(rtt) and abs(rtt["min"] - want_rtt) <= max(CHECK_RTT_TOL[0] * want_rtt,
                                                                  tol_ms)
        gp_ok = goodput is not None and abs(goodput / want_gp - 1) <= CHECK_GOODPUT_TOL
        rows.append(dict(cls=name, shaper=shaper, addr=addr, delay_ms=delay, loss=loss, rate_down_bps=down,
                         rtt_expected_ms=want_rtt, ping_sent=sent, ping_received=got,
                         ping_ms=rtt or None, rtt_ok=rtt_ok, download_bytes=size,
                         goodput_expected_bps=want_gp, goodput_bps=goodput,
                         goodput_error_pct=None if goodput is None else
                         100 * (goodput / want_gp - 1), goodput_ok=gp_ok,
                         curl_error=c.stderr.strip()[:200] or None))
    doc = dict(base_rtt_ms=base_us / 1000, rtt_tolerance=dict(share=CHECK_RTT_TOL[0],
               ms=tol_ms, tcg_guest=tcg), goodput_tolerance=CHECK_GOODPUT_TOL, classes=rows)
    write_atomic(os.path.join(a.dir, "shaping.json"), json.dumps(doc, indent=1) + "\n")
    text = render_shaping(doc)
    print(text, end="", file=sys.stderr)
    for r in rows:
        if not (r["rtt_ok"] and r["goodput_ok"]):
            print(f"independent: warning: the shaping of {r['cls']} is off its configuration (above): "
                  f"its figures grade the shaper as well as mimic", file=sys.stderr)


def render_shaping(doc):
    tol = doc.get("rtt_tolerance") or {}
    out = [f"shaping check (before the workload; base RTT {doc['base_rtt_ms']:.3f} ms): ping RTT "
           f"(min) against 2 x delay + base (within max({100 * tol.get('share', 0.1):g}%, "
           f"{tol.get('ms', 2.0):g} ms){'; TCG guest: netem timers fire late' if tol.get('tcg_guest') else ''}), "
           f"goodput against rate x 1448/1500 x (1 - loss)",
           f"{'class':14} {'shaper':10} {'RTT want':>9} {'ping min/avg/max/mdev ms':>28} {'lost':>5}  "
           f"{'goodput want':>12} {'got':>12} {'err%':>6}  verdict"]
    for r in doc["classes"]:
        pm = r["ping_ms"]
        ping = (f"{pm['min']:.2f}/{pm['avg']:.2f}/{pm['max']:.2f}/{pm['mdev']:.2f}" if pm
                else "no reply")
        gp = r["goodput_bps"]
        verdict = "ok" if r["rtt_ok"] and r["goodput_ok"] else "OFF: " + ", ".join(
            x for x, ok in (("RTT", r["rtt_ok"]), ("goodput", r["goodput_ok"])) if not ok)
        out.append(f"{r['cls']:14} {r.get('shaper', 'htb'):10} {r['rtt_expected_ms']:9.2f} {ping:>28} "
                   f"{r['ping_sent'] - r['ping_received']:2}/{r['ping_sent']:<2}  "
                   f"{r['goodput_expected_bps'] / 1e6:10.4f}M "
                   f"{(gp / 1e6 if gp else 0):10.4f}M "
                   f"{(r['goodput_error_pct'] if gp else 0):+6.1f}  {verdict}")
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------------------------- report


def pct(xs, p):
    """Linear-interpolated percentile (numpy's default, as mimic compare uses)."""
    xs = sorted(xs)
    if not xs:
        return None
    h = (len(xs) - 1) * p
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def share(ok, n):
    return ok / n if n else None


def fmt_pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def fmt_share(ok, n):
    return f"{100 * ok / n:5.1f}% ({ok}/{n})" if n else "    -"


def loss_summary(db, truth, clients, classes):
    """Per class: the configured random loss (downstream) against the analyzer's, pooled over
    the class's connections (each connection's rate weighted by its data segments): all losses
    (loss_rate_down) and those the bottleneck queue does not explain (loss_random_down)."""
    cols = {r[1] for r in db.execute("PRAGMA table_info(connections)")}
    rnd = "loss_random_down" if "loss_random_down" in cols else "NULL"
    per = {c: dict(n=0, pkts=0, lost=0.0, rnd=0.0, with_loss=0, configured=None) for c in classes}
    for ip, port, dpk, lr, lrr in db.execute(
            f"SELECT client_ip, client_port, data_pkts_down, loss_rate_down, {rnd} "
            "FROM connections"):
        t = truth.get((ip, port))
        if t is None or clients.get(t["conn"], {}).get("status") != "ok" or not dpk:
            continue
        q = per[t["class"]]
        q["configured"] = float(t["loss"])
        q["n"] += 1
        q["pkts"] += dpk
        q["lost"] += (lr or 0) * dpk
        q["rnd"] += (lrr if lrr is not None else (lr or 0)) * dpk
        q["with_loss"] += (lr or 0) > 0
    out = {}
    for c, q in per.items():
        out[c] = dict(connections=q["n"], data_pkts_down=q["pkts"], configured=q["configured"],
                      analyzed_all=share(q["lost"], q["pkts"]),
                      analyzed_random=share(q["rnd"], q["pkts"]),
                      connections_with_loss=q["with_loss"])
    return out


def render_loss(loss):
    out = ["loss downstream (configured random loss; the analyzer's pooled over the class's data "
           "segments: all losses, and those its queue model leaves random)",
           f"{'class':20} {'conns':>5} {'data segs':>9} {'configured':>10} {'all':>7} "
           f"{'random':>7} {'conns with loss':>15}"]
    for c, v in loss.items():
        def p(x):
            return f"{100 * x:6.2f}%" if x is not None else "      -"
        out.append(f"{c:20} {v['connections']:5} {v['data_pkts_down']:9} {p(v['configured']):>10} "
                   f"{p(v['analyzed_all'])} {p(v['analyzed_random'])} "
                   f"{v['connections_with_loss']:15}")
    return "\n".join(out) + "\n"


def load_pings(path):
    """The unshaped path's pings during the workload (ping -D's lines: "[t] 64 bytes from ...:
    icmp_seq=N ttl=64 time=X ms"): (reply time in µs since the epoch, RTT in ms, icmp_seq),
    in order; None without the file."""
    if not os.path.exists(path):
        return None
    out = []
    for l in open(path):
        if "time=" in l and "icmp_seq=" in l and l.startswith("["):
            try:
                out.append((int(float(l[1:l.index("]")]) * 1e6),
                            float(l.split("time=")[1].split()[0]),
                            int(l.split("icmp_seq=")[1].split()[0])))
            except ValueError:
                continue
    return out


# how far either side of a connection's life its concurrent base RTT looks for pings (they
# leave every 100 ms)
CONCURRENT_PING_WINDOW_US = 150_000


def concurrent_base_us(pings, t0, t1, base_rtt_us):
    """The base RTT the unshaped path had while a connection ran: the least RTT of the pings
    answered from 150 ms before its SYN to 150 ms after its end, never below the idle base
    (`base_rtt_us`, taken before the workload); the idle base where no ping falls in the
    window. What it adds to the idle base is the router's own delay then, which the analyzer
    rightly sees and the configured truth does not hold."""
    if t0 is None or t1 is None:
        return base_rtt_us
    near = [1000 * r for t, r, _ in pings or []
            if t0 - CONCURRENT_PING_WINDOW_US <= t <= t1 + CONCURRENT_PING_WINDOW_US]
    return max(base_rtt_us, min(near)) if near else base_rtt_us


def rtt_judged(rtt_us, lo_us, hi_us=None):
    """A min RTT against its truth, one value or the range `lo_us`..`hi_us` (µs): right within
    10% or 1 ms of it; the error (ms) is the distance to it, signed (0 inside a range)."""
    hi_us = lo_us if hi_us is None else hi_us
    ok = lo_us - max(0.1 * lo_us, 1000) <= rtt_us <= hi_us + max(0.1 * hi_us, 1000)
    err = rtt_us - lo_us if rtt_us < lo_us else rtt_us - hi_us if rtt_us > hi_us else 0
    return ok, err / 1000


def cmd_report(a):
    d = a.dir
    truth = {}
    for c in csv.DictReader(open(os.path.join(d, "truth.csv"))):
        truth[(c["client_ip"], int(c["client_port"]))] = c
    reqs = {}
    for r in csv.DictReader(open(os.path.join(d, "requests.csv"))):
        reqs.setdefault(r["conn"], []).append(r)
    clients = {r["conn"]: r for r in csv.DictReader(open(os.path.join(d, "clients.csv")))}
    served = {}
    sp = os.path.join(d, "server.csv")
    if os.path.exists(sp):
        for r in csv.DictReader(open(sp)):
            served[(r["client_ip"], int(r["client_port"]), int(r["seq"]))] = r
    base_rtt_us = float(open(os.path.join(d, "base_rtt_us")).read().strip())
    classes = [l.split()[1] for l in open(os.path.join(d, "classes.txt")) if l.strip()]
    rates = {c[0]: c[1] for c in CLASSES}

    pings = load_pings(os.path.join(d, "load-ping.txt"))
    sj = os.path.join(d, "shaping.json")
    shaping = json.load(open(sj)) if os.path.exists(sj) else None
    # each class's path as ping measured it through its own shaper before the workload (the
    # shaping check's average), where it answered. netem's delay leaves on a timer, which in a
    # TCG guest fires late, by a different amount for each packet: the check's 20 pings at 2-5
    # ms each way came back 0.06-3.0 ms late in the kept runs, 1.0-2.5 ms on average. A
    # connection's minimum RTT is the least of its few samples, each that late, so it lies
    # between 2 x delay + base (netem is never early) and, most of the time, what a typical
    # packet took (the pings' average); neither end alone is its truth.
    ping_path_us = {r["cls"]: 1000 * r["ping_ms"]["avg"] for r in (shaping or {}).get("classes", [])
                    if r.get("ping_ms")}

    db = sqlite3.connect(f"file:{a.flows}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT id, client_ip, client_port, server_port, min_rtt_us, bw_bps, data_pkts_down, "
        "complete, response_time_us, coalesce(mss_client, 0), coalesce(mss_server, 0), "
        "t_syn, t_end FROM connections").fetchall()
    exch = {}
    # connections with a query delay the analyzer found where the query server, which logs
    # what it did, paused for none: Monkey's split at a short segment, or after one that was
    # acknowledged, where the server's `sendall` waited for send-buffer space (on the quiet
    # rate-only capture 174 such responses, gaps of median 2.5 ms, the longest after 75-360
    # KB; GUIDE.md). Such a stall is replayed as a timed pause from the first write, which the
    # response's first part overlaps: the replay ends sooner
    conn_addr = {r[0]: (r[1], r[2]) for r in rows}
    stall_split = set()
    for cid, seq, rd, qd, rb in db.execute(
            "SELECT conn_id, seq, response_delay_us, query_delay_us, resp_bytes FROM exchanges "
            "ORDER BY conn_id, seq"):
        exch.setdefault(cid, []).append((rd, qd, rb))
        logged = served.get(conn_addr.get(cid, ("", 0)) + (seq,))
        if (qd or 0) > 2000 and logged is not None and int(logged["query_delay_us"]) == 0:
            stall_split.add(cid)

    # -- the analyzer against the truth, per class
    per = {c: dict(n=0, unmatched=0, rtt=[], rtt_load=[], rtt_path=[], rd=[], qd=[], rd_nginx=[], qd_nginx=[], bw=[], bw_all=0, bw_none=0,
                   bw_hi=0, bw_lo=0, ex_mismatch=0) for c in classes}
    matched = set()
    conn_rows = []
    flows_by_id = {}
    for (cid, ip, port, sport, rtt, bw, dpk, complete, rt, mssc, msss, t0, t1) in rows:
        t = truth.get((ip, port))
        if t is None:
            continue
        flows_by_id[cid] = t
        if clients.get(t["conn"], {}).get("status") != "ok":
            continue
        matched.add(t["conn"])
        p = per[t["class"]]
        p["n"] += 1
        true_rtt = 1000 * (float(t["delay_down_ms"]) + float(t["delay_up_ms"])) + base_rtt_us
        rtt_ok = None
        if rtt is not None:
            rtt_ok, e = rtt_judged(rtt, true_rtt)
            p["rtt"].append((rtt_ok, e))
        # the same, with the base RTT the unshaped path had while the connection ran (the
        # router's own delay then, measured by ping, not by mimic)
        load_base = concurrent_base_us(pings, t0, t1, base_rtt_us)
        true_rtt_load = true_rtt - base_rtt_us + load_base
        rtt_load_ok = None
        if rtt is not None:
            rtt_load_ok, e = rtt_judged(rtt, true_rtt_load)
            p["rtt_load"].append((rtt_load_ok, e))
        # the same against a range: from that truth up to the class's path as ping measured it
        # through its shaper (the shaping check's average) plus what the router's own delay
        # added while the connection ran
        true_rtt_path = rtt_path_ok = None
        if t["class"] in ping_path_us:
            true_rtt_path = max(true_rtt_load, ping_path_us[t["class"]] + load_base - base_rtt_us)
            if rtt is not None:
                rtt_path_ok, e = rtt_judged(rtt, true_rtt_load, true_rtt_path)
                p["rtt_path"].append((rtt_path_ok, e))
        ex = exch.get(cid, [])
        rq = reqs[t["conn"]]
        if len(ex) == len(rq):
            for s, ((rd, qd, rb), r) in enumerate(zip(ex, rq)):
                sv = served.get((ip, port, s))
                trd = int(sv["response_delay_us"]) if sv else int(r["response_delay_us"])
                tqd = int(sv["query_delay_us"]) if sv else int(r["query_delay_us"])
                # the query server logs what it did (the truth); nginx's delays are nominal
                # (0: a static file), so a loaded host's scheduling shows up there as error
                sfx = "" if t["server"] == "query" else "_nginx"
                if rd is not None:
                    p["rd" + sfx].append((abs(rd - trd) <= 2000, (rd - trd) / 1000))
                if qd is not None:
                    p["qd" + sfx].append((abs(qd - tqd) <= 2000, (qd - tqd) / 1000))
        else:
            p["ex_mismatch"] += 1
        # bandwidth: connections that carry at least 10 full-size data segments
        true_bw = float(t["rate_down_bps"])
        full = int(t["resp_body_bytes"]) >= 10 * MSS_SEGMENT and (dpk or 0) >= 10
        err = None if bw is None else (bw - true_bw) / true_bw
        if full:
            p["bw_all"] += 1
            if bw is None:
                p["bw_none"] += 1
            else:
                p["bw"].append((abs(err) <= 0.2, 100 * err))
                p["bw_hi"] += err > 0.2
                p["bw_lo"] += err < -0.2
        conn_rows.append((t["conn"], t["class"], ip, port, sport, t["client"], t["server"],
                          true_rtt / 1000, None if rtt is None else rtt / 1000, rtt_ok,
                          round(true_rtt_load / 1000, 3), rtt_load_ok,
                          None if true_rtt_path is None else round(true_rtt_path / 1000, 3),
                          rtt_path_ok,
                          true_bw, bw, None if err is None else round(100 * err, 2), full,
                          dpk, len(rq), len(ex), rt))
    for c in truth.values():
        if clients.get(c["conn"], {}).get("status") == "ok" and c["conn"] not in matched:
            per[c["class"]]["unmatched"] += 1

    def bw_summary(p):
        ok = sum(1 for x in p["bw"] if x[0])
        errs = [x[1] for x in p["bw"]]
        return dict(connections=p["bw_all"], within_20=ok, share=share(ok, p["bw_all"]),
                    with_estimate=p["bw_all"] - p["bw_none"], without_estimate=p["bw_none"],
                    too_high=p["bw_hi"], too_low=p["bw_lo"],
                    median_error_pct=pct(errs, 0.5))

    def checks(p):
        def ck(xs):
            ok = sum(1 for x in xs if x[0])
            return dict(n=len(xs), ok=ok, share=share(ok, len(xs)),
                        median_error_ms=pct([x[1] for x in xs], 0.5))
        return dict(connections=p["n"], not_in_capture=p["unmatched"],
                    exchange_count_differs=p["ex_mismatch"], min_rtt=ck(p["rtt"]),
                    min_rtt_concurrent_base=ck(p["rtt_load"]),
                    min_rtt_ping_range=ck(p["rtt_path"]),
                    response_delay=ck(p["rd"]), query_delay=ck(p["qd"]),
                    response_delay_nginx_nominal=ck(p["rd_nginx"]),
                    query_delay_nginx_nominal=ck(p["qd_nginx"]), bandwidth=bw_summary(p))

    def pool(names):
        q = dict(n=0, unmatched=0, rtt=[], rtt_load=[], rtt_path=[], rd=[], qd=[], rd_nginx=[], qd_nginx=[], bw=[], bw_all=0, bw_none=0, bw_hi=0,
                 bw_lo=0, ex_mismatch=0)
        for nm in names:
            for k, v in per[nm].items():
                q[k] = q[k] + v
        return q

    analyzer = {c: checks(per[c]) for c in classes}
    # each class's shaper, from the truth (captures before the column: htb)
    for t in truth.values():
        if t["class"] in analyzer:
            analyzer[t["class"]]["shaper"] = t.get("shaper") or "htb"
    analyzer["all"] = checks(pool(classes))
    shaped = [c for c in classes if rates[c] <= 10_000_000]
    analyzer["shaped <= 10 Mbit/s"] = checks(pool(shaped))

    # -- replay fidelity, per class
    replay = None
    if a.replay:
        rdb = sqlite3.connect(f"file:{a.replay}?mode=ro", uri=True)
        rrt = dict(rdb.execute("SELECT id, response_time_us FROM connections"))
        orig_rt = {r[0]: r[8] for r in rows}
        rp = {c: dict(errs=[], failed=0, no_rt=0) for c in classes}
        rep_rows = []
        causes = {c: {} for c in classes}

        def lost(dbc):
            return {i: (r or 0) - (s or 0) > 0 for i, r, s in dbc.execute(
                "SELECT id, retx_down, spurious_retx_down FROM connections")}

        def stalled(dbc):
            # time the client's window stayed closed while the server had data (schema
            # migration 5); older databases only count zero-window segments
            cols = {r[1] for r in dbc.execute("PRAGMA table_info(exchanges)")}
            if "zero_window_us" in cols:
                return dict(dbc.execute("SELECT conn_id, sum(coalesce(zero_window_us, 0)) "
                                        "FROM exchanges GROUP BY conn_id"))
            return {i: n for i, n in dbc.execute("SELECT id, zero_window FROM connections")}

        o_lost, r_lost, o_stall = lost(db), lost(rdb), stalled(db)
        o_bw = {r[0]: r[5] for r in rows}
        o_ex = {i: n for i, n in db.execute("SELECT id, exchanges FROM connections")}

        def spurious(dbc):
            return {i: s or 0 for i, s in dbc.execute(
                "SELECT id, spurious_retx_down FROM connections")}

        o_spur, r_spur = spurious(db), spurious(rdb)

        def slower_than_path(o):
            # a one-exchange original that took longer than its own path allows: more than
            # 1.2 x (server delays + its bytes at its bottleneck rate) + 5 ms (a LAN slow start),
            # without loss or a closed window. At a server-side tap the last byte passes before
            # it reaches the client, so only something outside the network did that: the
            # client's host fell behind (ACKs silent for tens of ms, its window shrinking but
            # not closed; curl on the loaded testbed host), which a replay's client, reading at
            # once, does not do. Its replay is faster.
            ex, bw, rt = exch.get(o) or [], o_bw.get(o), orig_rt.get(o)
            if len(ex) != 1 or not bw or not rt:
                return False
            rd, qd, rb = ex[0]
            allow = 1.2 * ((rd or 0) + (qd or 0) + (rb or 0) * 8 / bw * 1e6) + 5000
            return rt > allow

        o_queue = dict(db.execute("SELECT id, queue_down_pkts FROM connections"))
        r_queue = dict(rdb.execute("SELECT id, queue_down_pkts FROM connections"))

        def deeper_queue(o, rid):
            # the replay's own capture shows a bottleneck queue at least 10 packets deeper than
            # the original's (the analyzer's queue model on each, queue_down_pkts): its client
            # let the server put more in flight than the original's did (on the rate-only
            # capture, originals whose client's window held the server to about half the flight
            # of the connections that replayed well: a client that read more slowly than its
            # link), so the tap saw the last byte leave that much earlier (or the replay's queue
            # overflowed, which the loss causes above catch first)
            a, b = o_queue.get(o), r_queue.get(rid)
            return a is not None and b is not None and b - a >= 10

        def miss_cause(o, rid):
            # the first that applies: why a replay missed its original by more than 20%
            if o_stall.get(o):
                return "zero_window"
            lo, lr = o_lost.get(o, False), r_lost.get(rid, False)
            if lo and lr:
                return "loss_both"
            if lo:
                return "loss_original_only"
            if lr:
                return "loss_replay_only"
            if r_spur.get(rid, 0) > o_spur.get(o, 0):
                # the replay's server resent what had arrived (a tail-loss probe or timeout
                # before the first ACK; a resend moves the tap's last response byte)
                return "spurious_retx_replay_only"
            if o in stall_split:
                return "server_stall_as_query_delay"
            if o_bw.get(o) is None:
                return "no_estimate"
            if slower_than_path(o):
                return "original_slower_than_path"
            if deeper_queue(o, rid):
                return "replay_queue_deeper"
            if (o_ex.get(o) or 0) > 1:
                return "several_exchanges"
            if (orig_rt.get(o) or 0) < 20_000:
                return "original_under_20ms"
            return "other"
        for o, rid, status in rdb.execute(
                "SELECT orig_conn_id, replay_conn_id, status FROM replay_map"):
            t = flows_by_id.get(o)
            if t is None:
                continue
            q = rp[t["class"]]
            ort = orig_rt.get(o)
            if status != "ok" or rid is None:
                q["failed"] += 1
                rep_rows.append((o, t["conn"], t["class"], ort, None, None, status, None))
                continue
            rt = rrt.get(rid)
            if not ort or rt is None:
                q["no_rt"] += 1
                rep_rows.append((o, t["conn"], t["class"], ort, rt, None, "no_response_time", None))
                continue
            e = (rt - ort) / ort
            q["errs"].append(e)
            cause = None
            if abs(e) > 0.2 + 1e-12:
                cause = miss_cause(o, rid)
                causes[t["class"]][cause] = causes[t["class"]].get(cause, 0) + 1
            rep_rows.append((o, t["conn"], t["class"], ort, rt, round(100 * e, 2), "ok", cause))

        def fid(q):
            n = len(q["errs"]) + q["failed"]
            ok = sum(1 for e in q["errs"] if abs(e) <= 0.2 + 1e-12)
            return dict(replayed=n, paired=len(q["errs"]), failed=q["failed"],
                        no_response_time=q["no_rt"], within_20=ok, share=share(ok, n),
                        median_error_pct=pct([100 * e for e in q["errs"]], 0.5),
                        p10_error_pct=pct([100 * e for e in q["errs"]], 0.1),
                        p90_error_pct=pct([100 * e for e in q["errs"]], 0.9))
        replay = {c: fid(rp[c]) for c in classes}
        allq = dict(errs=sum((rp[c]["errs"] for c in classes), []),
                    failed=sum(rp[c]["failed"] for c in classes),
                    no_rt=sum(rp[c]["no_rt"] for c in classes))
        replay["all"] = fid(allq)
        write_csv_atomic(os.path.join(a.out, "replay.csv"),
                         ["orig_conn_id", "truth_conn", "class", "orig_response_time_us",
                          "replay_response_time_us", "error_pct", "status", "miss_cause"], rep_rows)
        allc = {}
        for c in classes:
            for k, v in causes[c].items():
                allc[k] = allc.get(k, 0) + v
        causes["all"] = allc
        replay["miss_causes"] = causes
        if a.compare_json:
            # mimic compare's own per-connection pairing (replay_map, consistency-checked),
            # over the pairs it formed (failed replays left out), as a cross-check
            cj = json.load(open(a.compare_json))
            paired = (cj.get("comparisons") or [{}])[0].get("paired") or {}
            ov = paired.get("overall") or {}
            replay["mimic_compare"] = dict(pairs=ov.get("n", paired.get("pairs")),
                                           within_20=ov.get("within_20"),
                                           within_10=ov.get("within_10"),
                                           consistent=paired.get("consistent"))
        rj = os.path.join(d, "replay.json")
        if os.path.exists(rj):
            # mimic replay's own counts: where each connection's rate came from, and the
            # delayed-ACK timeouts of the ACK shaping: measured, pooled, defaulted
            replay["rate_sources"] = json.load(open(rj)).get("rate_sources") or {}

    dep = os.path.join(d, "departures.json")
    departures = json.load(open(dep)) if os.path.exists(dep) else None
    loss = loss_summary(db, truth, clients, classes)
    load_rtt = None
    if pings is not None:
        rtts = [r for _, r, _ in pings]
        sent = max((q for _, _, q in pings), default=0)
        load_rtt = dict(replies=len(rtts), sent=sent, median_ms=pct(rtts, 0.5),
                        p90_ms=pct(rtts, 0.9), p99_ms=pct(rtts, 0.99),
                        max_ms=max(rtts) if rtts else None)
        # the truth holds only while the router forwards without queueing of its own
        load_rtt["router_overloaded"] = bool(
            rtts and pct(rtts, 0.99) - base_rtt_us / 1000 > ROUTER_OWN_QUEUE_MS)
    rp = os.path.join(d, "router.txt")
    router = open(rp).read().strip() if os.path.exists(rp) else None
    load = {}
    for k in ("start", "end"):
        lp = os.path.join(d, f"loadavg-{k}")
        if os.path.exists(lp):
            load[k] = open(lp).read().strip()
    doc = dict(truth_dir=d, host_loadavg=load, shaper_departures=departures, flows=a.flows, replay=a.replay, base_rtt_us=base_rtt_us,
               no_delay=a.no_delay, analyzer=analyzer, replay_fidelity=replay, router=router,
               shaping_check=shaping, loss=loss, unshaped_rtt_during_workload=load_rtt)
    write_atomic(os.path.join(a.out, "table.json"), json.dumps(doc, indent=1, default=str) + "\n")
    write_csv_atomic(os.path.join(a.out, "analyzer.csv"),
                     ["truth_conn", "class", "client_ip", "client_port", "server_port",
                      "client", "server", "true_min_rtt_ms", "min_rtt_ms", "min_rtt_ok",
                      "true_min_rtt_concurrent_base_ms", "min_rtt_concurrent_base_ok",
                      "true_min_rtt_ping_range_top_ms", "min_rtt_ping_range_ok",
                      "true_bw_bps", "bw_bps", "bw_error_pct", "bw_counted", "data_pkts_down",
                      "requests", "exchanges", "response_time_us"], conn_rows)
    summary_rows = []
    for c, v in analyzer.items():
        b = v["bandwidth"]
        summary_rows.append((c, v["connections"], v["min_rtt"]["share"],
                             v["min_rtt_concurrent_base"]["share"],
                             v["min_rtt_ping_range"]["share"],
                             v["response_delay"]["share"], v["query_delay"]["share"],
                             v["response_delay_nginx_nominal"]["share"],
                             v["query_delay_nginx_nominal"]["share"],
                             b["connections"], b["share"], b["with_estimate"],
                             b["without_estimate"], b["too_high"], b["too_low"],
                             b["median_error_pct"],
                             *((replay[c]["share"], replay[c]["median_error_pct"],
                                replay[c]["p10_error_pct"], replay[c]["p90_error_pct"])
                               if replay and c in replay else (None,) * 4)))
    write_csv_atomic(os.path.join(a.out, "table.csv"),
                     ["class", "connections", "min_rtt_right", "min_rtt_right_concurrent_base",
                      "min_rtt_right_ping_range",
                      "response_delay_2ms",
                      "query_delay_2ms", "nginx_response_delay_2ms", "nginx_query_delay_2ms",
                      "bw_connections", "bw_within_20", "bw_with_estimate",
                      "bw_without_estimate", "bw_too_high", "bw_too_low", "bw_median_error_pct",
                      "replay_within_20", "replay_median_error_pct", "replay_p10_error_pct",
                      "replay_p90_error_pct"], summary_rows)
    text = render(analyzer, replay, base_rtt_us, a.no_delay)
    if not a.no_delay:
        text += render_loss(loss)
    if router:
        text = f"shapers: {router}\n" + text
    if shaping:
        text += render_shaping(shaping)
    if load_rtt and load_rtt["replies"]:
        text += (f"unshaped RTT during the workload (ping every 100 ms from 198.19.255.1, through "
                 f"the router): median {load_rtt['median_ms']:.2f} ms, p90 {load_rtt['p90_ms']:.2f}, "
                 f"p99 {load_rtt['p99_ms']:.2f}, max {load_rtt['max_ms']:.2f}; "
                 f"{load_rtt['replies']} of {load_rtt['sent']} answered (base RTT "
                 f"{base_rtt_us / 1000:.3f} ms: what is above it, the router's own queueing, is in "
                 f"no truth)\n")
        if load_rtt["router_overloaded"]:
            warn = (f"WARNING: the router queued on its own: the unshaped RTT's p99 is "
                    f"{load_rtt['p99_ms'] - base_rtt_us / 1000:.1f} ms above the base RTT (more than "
                    f"{ROUTER_OWN_QUEUE_MS} ms), so paths were slower than their truth while it did "
                    f"and these tables grade the router as much as mimic: run fewer households at "
                    f"once (--addrs, --fast-addrs, --classes) on this machine\n")
            text += warn
            print(f"independent: {warn}", end="", file=sys.stderr)
    if load:
        text += (f"host load average (1/5/15 min) when the clients started: "
                 f"{load.get('start', '-')}, when they ended: {load.get('end', '-')}\n")
    if departures:
        text += (f"shaper departures (htb, {departures['rate_bps'] / 1e6:g} Mbit/s): median gap "
                 f"{departures['median_gap_ms']:.3f} ms for {departures['serialization_ms']:.3f} ms "
                 f"of serialization, {100 * departures.get('within_one_release', 0):.0f}% within "
                 f"one release, {fmt_pct(departures['on_tick_grid'])} of the gaps between releases "
                 f"on a {departures['tick_ms']:g} ms grid\n")
    write_atomic(os.path.join(a.out, "table.txt"), text)
    print(text, end="")


def render(analyzer, replay, base_rtt_us, no_delay):
    def s(c):
        return fmt_share(c["ok"], c["n"])

    def sh(c):
        return f"{100 * c['ok'] / c['n']:5.1f}%" if c["n"] else "    -"

    def f(x, w=6):
        return f"{x:+{w}.1f}" if x is not None else " " * (w - 1) + "-"

    out = [f"independent testbed: analyzer against the configured truth"
           f" ({'rate-only classes, LAN RTT ' if no_delay else ''}base RTT {base_rtt_us / 1000:.3f} ms)",
           "min RTT right: within 10% or 1 ms of 2 x the configured delay + the base RTT; load base:"
           " the base RTT the unshaped path's pings had while the connection ran; ping range: from"
           " that up to the class's shaped path as ping measured it before the workload (average;"
           " netem's late timers included) plus what the load base added",
           "response and query delay: exchanges of the query server (truth: what it logged);"
           " nginx: against a nominal 0",
           f"{'class':20} {'conns':>5}  {'min RTT right':>19}  {'same, load base':>19}  {'ping range':>19}  "
           f"{'resp. delay 2 ms':>19}  "
           f"{'query delay 2 ms':>19}  {'nginx rd/qd 2 ms':>16}  "
           f"{'bandwidth within 20% (>= 10 full segs)':>38}  "
           f"{'est/none':>9} {'hi/lo':>7} {'med err%':>8}"]
    for c, v in analyzer.items():
        b = v["bandwidth"]
        out.append(f"{c:20} {v['connections']:5}  {s(v['min_rtt']):>19}  "
                   f"{s(v['min_rtt_concurrent_base']):>19}  {s(v['min_rtt_ping_range']):>19}  "
                   f"{s(v['response_delay']):>19}  {s(v['query_delay']):>19}  "
                   f"{sh(v['response_delay_nginx_nominal']):>7} /{sh(v['query_delay_nginx_nominal']):>7}  "
                   f"{fmt_share(b['within_20'], b['connections']):>38}  "
                   f"{b['with_estimate']:>4}/{b['without_estimate']:<4} "
                   f"{b['too_high']:>3}/{b['too_low']:<3} {f(b['median_error_pct'], 8)}")
    miss = sum(v["not_in_capture"] for k, v in analyzer.items() if k not in ("all", "shaped <= 10 Mbit/s"))
    if miss:
        out.append(f"({miss} connections the clients completed are not in flows.db)")
    if replay:
        out.append("")
        out.append("replay fidelity (mimic replay --lab of the analyzed flows.db): response time, "
                   "replay against original")
        out.append(f"{'class':20} {'replayed':>8} {'failed':>6}  {'within +-20%':>19}  "
                   f"{'median%':>7} {'p10%':>7} {'p90%':>7}")
        for c, v in replay.items():
            if c in ("mimic_compare", "rate_sources", "miss_causes"):
                continue
            out.append(f"{c:20} {v['replayed']:8} {v['failed']:6}  "
                       f"{fmt_share(v['within_20'], v['replayed']):>19}  "
                       f"{f(v['median_error_pct'], 7)} {f(v['p10_error_pct'], 7)} "
                       f"{f(v['p90_error_pct'], 7)}")
        mc = replay.get("mimic_compare")
        if mc and mc.get("within_20") is not None:
            out.append(f"mimic compare, same pairs without the failed ones: "
                       f"{100 * mc['within_20']:.1f}% within +-20%, {100 * mc['within_10']:.1f}% "
                       f"within +-10% ({mc['pairs']} pairs)")
        mc = replay.get("miss_causes")
        if mc:
            out.append("misses (beyond +-20%) by cause, the first that applies: zero_window (the "
                       "original client stopped reading), loss in the original / the replay / both, "
                       "spurious_retx_replay_only (the replay's server resent what had arrived), "
                       "server_stall_as_query_delay (the analyzer's query delay where the query server "
                       "logged none: its send-buffer stalls), no_estimate, original_slower_than_path (the original's client fell behind its own path), "
                       "replay_queue_deeper (the replay's bottleneck queue 10+ packets deeper than the original's: "
                       "its client let more into flight), several_exchanges, original_under_20ms, other")
            for c, v in mc.items():
                out.append(f"{c:20} " + ", ".join(f"{k} {n}" for k, n in
                                                 sorted(v.items(), key=lambda x: -x[1])))
        rs = replay.get("rate_sources")
        if rs:
            out.append(f"rates (mimic replay --unestimated {rs.get('unestimated')}): "
                       f"{rs.get('estimated', 0)} estimated, {rs.get('overruled_by_client', 0)} own estimates of "
                       f"1-2 samples overruled by their client's, {rs.get('pooled_by_client', 0)} pooled "
                       f"by client, {rs.get('pooled_by_class', 0)} pooled by RTT class, "
                       f"{rs.get('unshaped_by_request', 0)} unshaped, {rs.get('left_out', 0)} left "
                       f"out; {rs.get('delack_timeout_defaulted', 0)} delayed-ACK timeouts over 2 s "
                       f"not held; {rs.get('paused_reads', 0)} clients pause their "
                       f"reads (zero window), {rs.get('paced_reads', 0)} read at the original's "
                       f"pace ({rs.get('paced_reads_ack_clock', 0)} of them on its ACK clock's "
                       f"evidence, window open), {rs.get('window_profiles', 0)} hold their "
                       f"window to the original's across a response")
            dl = rs.get("delack")
            if dl:
                # where the ACK shaping's timeouts came from (mimic replay's orchestrate::delack)
                out.append(f"delayed-ACK timeouts of the ACK shaping: {dl.get('own', 0)} measured, "
                           f"{dl.get('client', 0)} as their client's other connections', "
                           f"{dl.get('workload', 0)} as the workload's median, "
                           f"{dl.get('default', 0)} the 200 ms default")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------- prediction


def kolmogorov_sf(lam):
    """P(K > lam) for the Kolmogorov distribution (the KS test's asymptotic p-value), as
    mimic compare's stats.rs computes it."""
    if lam <= 0:
        return 1.0
    if lam < 1.0:
        cdf = 0.0
        for k in range(1, 101):
            t = math.exp(-((2 * k - 1) ** 2) * math.pi ** 2 / (8 * lam * lam))
            cdf += t
            if t < 1e-18 * max(cdf, 1e-300):
                break
        return min(1.0, max(0.0, 1.0 - math.sqrt(2 * math.pi) / lam * cdf))
    s = 0.0
    for k in range(1, 101):
        t = 2 * (-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam)
        s += t
        if abs(t) < 1e-18:
            break
    return min(1.0, max(0.0, s))


def ks_2samp(a, b):
    """Two-sample KS: D = sup |F_a - F_b| (ties step together, as mimic compare counts them)
    and the asymptotic p-value; None when a sample is empty."""
    a, b = sorted(a), sorted(b)
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return None
    i = j = 0
    d = 0.0
    while i < n1 or j < n2:
        v = min(a[i] if i < n1 else math.inf, b[j] if j < n2 else math.inf)
        while i < n1 and a[i] <= v:
            i += 1
        while j < n2 and b[j] <= v:
            j += 1
        d = max(d, abs(i / n1 - j / n2))
    en = n1 * n2 / (n1 + n2)
    return dict(d=d, p_value=kolmogorov_sf(math.sqrt(en) * d), method="asymptotic", n1=n1, n2=n2)


def first_flights(pcap, server_ip=SERVER_IP):
    """Per connection (client address, port): the server's initial window as the tap shows it,
    max(packets sent - 2 x packets acked) over the connection until its first retransmission or
    the client's first SACK (connections whose SYN-ACK was retransmitted are left out).
    While the window grows by at most one packet per packet acked (slow start, BBR's startup),
    packets in flight = sent - acked <= initcwnd + acked; at the start of a window-limited
    response the bound is reached. (Counting only the packets before the first ACK would not
    do: on these LAN-RTT links the first ACK comes back while the server is still writing its
    first flight, and nginx's header packet is acknowledged before its body leaves.) A tail loss
    probe may send one packet over the window. Read with tcpdump, as `departures` does."""
    p = subprocess.Popen(["tcpdump", "-r", pcap, "-n", "-S", "tcp"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    st = {}  # peer -> [first seq, highest end, ends of the packets sent in order, acked, best]
    done, syn_acks = set(), {}
    srv = server_ip + "."
    for line in p.stdout:
        f = line.split()
        # TIME IP SRC > DST: Flags [..], seq A:B, ack X, ..., length N
        if len(f) < 7 or f[1] != "IP":
            continue
        src, dst = f[2], f[4].rstrip(":")
        from_server = src.startswith(srv)
        peer = dst if from_server else src
        if peer in done:
            continue
        if from_server:
            if "seq" not in f:
                continue
            if f[6] == "[S.],":
                # a retransmitted SYN-ACK makes the kernel start at one packet (RFC 6298 5.7):
                # not the route's window, so the connection is left out
                syn_acks[peer] = syn_acks.get(peer, 0) + 1
                if syn_acks[peer] > 1:
                    done.add(peer)
                    st.pop(peer, None)
                continue
            sq = f[f.index("seq") + 1].rstrip(",")
            if ":" not in sq:
                continue  # no payload
            a, b = (int(x) for x in sq.split(":"))
            if b == a:
                continue
            s = st.get(peer)
            if s is None:
                s = st[peer] = [a, a, [], 0, 0]
            if a != s[1]:
                done.add(peer)  # a retransmission (or a packet the tap missed): stop here
                continue
            s[1] = b
            s[2].append((b - s[0]) % 2**32)
            s[4] = max(s[4], len(s[2]) - 2 * s[3])
        elif peer in st and "ack" in f:
            if "sack " in line:  # "sack 1 {..}" in the options (the SYN's "sackOK," is not)
                done.add(peer)  # a loss: the server sends on SACKs, not on its window alone
                continue
            s = st[peer]
            ack = (int(f[f.index("ack") + 1].rstrip(",")) - s[0]) % 2**32
            if ack < 2**31:
                while s[3] < len(s[2]) and s[2][s[3]] <= ack:
                    s[3] += 1
    _, err = p.communicate()
    if p.returncode != 0:
        die(f"tcpdump -r {pcap}: {err.strip()}")
    out = {}
    for peer, s in st.items():
        ip, port = peer.rsplit(".", 1)
        out[(ip, int(port))] = s[4]
    return out


def flight_check(d, iw):
    """The server's initial window as the capture shows it (first_flights): over the
    connections whose first response was written at once and is longer than 2 x `iw` + 2 full
    segments (so the window, not the response, bounds the start), the windows seen."""
    truth = {(c["client_ip"], int(c["client_port"])): c
             for c in csv.DictReader(open(os.path.join(d, "truth.csv")))}
    first = {}
    for r in csv.DictReader(open(os.path.join(d, "requests.csv"))):
        if r["seq"] == "0":
            first[r["conn"]] = r
    flights = first_flights(os.path.join(d, "cap.pcap"))
    hist = {}
    for key, c in truth.items():
        r = first[c["conn"]]
        split = int(r["query_delay_us"]) and int(r["header_body_bytes"])
        if split or int(r["body_bytes"]) < (2 * iw + 2) * MSS_SEGMENT or key not in flights:
            continue
        hist[flights[key]] = hist.get(flights[key], 0) + 1
    n = sum(hist.values())
    return dict(initcwnd=iw, connections=n, flights=dict(sorted(hist.items())),
                equal_to_initcwnd=hist.get(iw, 0), share=share(hist.get(iw, 0), n))


def server_time(db):
    """Connection id -> the time its server spent on its exchanges (the analyzer's response and
    query delays summed): what a stack change leaves alone, and what a loaded host disturbs."""
    return dict(db.execute(
        "SELECT conn_id, sum(coalesce(response_delay_us, 0) + coalesce(query_delay_us, 0)) "
        "FROM exchanges GROUP BY conn_id"))


def server_delays(flows):
    """p50 and p90 of the response delays (ms) per server port of one analyzed capture or
    replay: nginx (80) and the query server (8080)."""
    db = sqlite3.connect(f"file:{flows}?mode=ro", uri=True)
    out = {}
    # (a replay's server emulator answers on ports of its own: there, all exchanges together)
    for port, name in ((NGINX_PORT, "nginx"), (QUERY_PORT, "query"), (None, "all")):
        xs = [r[0] / 1000 for r in db.execute(
            "SELECT e.response_delay_us FROM exchanges e JOIN connections c ON c.id = e.conn_id "
            "WHERE (?1 IS NULL OR c.server_port = ?1) AND e.response_delay_us IS NOT NULL",
            (port,))]
        if xs:
            out[name] = dict(exchanges=len(xs), p50_ms=pct(xs, 0.5), p90_ms=pct(xs, 0.9),
                             over_100ms=sum(1 for x in xs if x > 100))
    db.close()
    return out


def response_times(d, flows):
    """Truth connection -> (class, response time, response time less the server's time; in
    us) of the connections the clients completed, from an analyzed capture; and the capture's
    connection ids -> truth."""
    truth = {(c["client_ip"], int(c["client_port"])): c
             for c in csv.DictReader(open(os.path.join(d, "truth.csv")))}
    clients = {r["conn"]: r for r in csv.DictReader(open(os.path.join(d, "clients.csv")))}
    db = sqlite3.connect(f"file:{flows}?mode=ro", uri=True)
    srv = server_time(db)
    out, by_id = {}, {}
    for cid, ip, port, rt in db.execute(
            "SELECT id, client_ip, client_port, response_time_us FROM connections"):
        t = truth.get((ip, port))
        if t is None:
            continue
        by_id[cid] = t
        if rt is not None and clients.get(t["conn"], {}).get("status") == "ok":
            out[t["conn"]] = (t["class"], rt, rt - (srv.get(cid) or 0))
    db.close()
    return out, by_id


def replayed_times(replay, by_id):
    """Truth connection -> (class, response time, less the server's time) of a replay of an
    analyzed capture (its replay_map pairs the replay's connections with the capture's)."""
    db = sqlite3.connect(f"file:{replay}?mode=ro", uri=True)
    rt = dict(db.execute("SELECT id, response_time_us FROM connections"))
    srv = server_time(db)
    out = {}
    for o, rid, status in db.execute("SELECT orig_conn_id, replay_conn_id, status FROM replay_map"):
        t = by_id.get(o)
        if t is None or status != "ok" or rid is None or rt.get(rid) is None:
            continue
        out[t["conn"]] = (t["class"], rt[rid], rt[rid] - (srv.get(rid) or 0))
    db.close()
    return out


def median_shift_ci(pairs, reps=1000, seed=18):
    """A paired bootstrap (resampling connections) of median(after) - median(before): the 95%
    interval of the shift, from the connections' own spread (the run-to-run noise of each
    connection is inside its pair)."""
    if len(pairs) < 10:
        return None
    rng = random.Random(seed)
    n = len(pairs)
    shifts = []
    for _ in range(reps):
        s = [pairs[rng.randrange(n)] for _ in range(n)]
        shifts.append(pct([x[1] for x in s], 0.5) - pct([x[0] for x in s], 0.5))
    return [pct(shifts, 0.025), pct(shifts, 0.975)]


def prediction_row(real_from, real_to, base, pred, conns):
    """The figures of one group of connections (times in us)."""
    def vals(m):
        return [m[c][1] for c in conns if c in m]

    rf, rt, bs, pr = vals(real_from), vals(real_to), vals(base), vals(pred)
    med = {k: pct(v, 0.5) for k, v in (("real_from", rf), ("real_to", rt),
                                         ("replay_from", bs), ("predicted_to", pr))}
    shift_real = None if None in (med["real_to"], med["real_from"]) else med["real_to"] - med["real_from"]
    # the predicted shift against the replay's own baseline (the same replay at FROM): what the
    # stack change does in the replay, free of the replay's own bias
    shift_pred = None if None in (med["predicted_to"], med["replay_from"]) else med["predicted_to"] - med["replay_from"]
    shift_pred_orig = None if None in (med["predicted_to"], med["real_from"]) else med["predicted_to"] - med["real_from"]
    ci = median_shift_ci([(real_from[c][1], real_to[c][1]) for c in conns
                          if c in real_from and c in real_to])
    ci_pred = median_shift_ci([(base[c][1], pred[c][1]) for c in conns if c in base and c in pred])
    ratio = shift_pred / shift_real if shift_real else None
    # the 15% criterion can be judged only where the real shift is known better than 15% of
    # itself: its 95% interval excludes 0 and lies within +-15% of it
    measurable = bool(ci and shift_real and ci[0] * ci[1] > 0
                      and max(abs(ci[0] - shift_real), abs(ci[1] - shift_real)) <= 0.15 * abs(shift_real))
    ks_pred = ks_2samp(pr, rt)
    return dict(
        connections=dict(real_from=len(rf), real_to=len(rt), replay_from=len(bs), predicted_to=len(pr)),
        median_us=med,
        ks_predicted_vs_real_to=ks_pred,
        ks_real_from_vs_real_to=ks_2samp(rf, rt),
        ks_replay_from_vs_real_from=ks_2samp(bs, rf),
        ks_predicted_vs_real_from=ks_2samp(pr, rf),
        median_shift_real_us=shift_real,
        median_shift_real_ci95_us=ci,
        median_shift_predicted_us=shift_pred,
        median_shift_predicted_ci95_us=ci_pred,
        median_shift_predicted_vs_original_us=shift_pred_orig,
        shift_ratio=ratio,
        shift_measurable=measurable,
        ks_ok=bool(ks_pred and ks_pred["d"] <= 0.05 + 1e-12),
        predicted_shift_in_real_ci95=(ci[0] <= shift_pred <= ci[1]) if (ci and shift_pred is not None) else None,
        shift_within_15=(abs(ratio - 1) <= 0.15) if (ratio is not None and measurable) else None,
    )


def cmd_predict(a):
    for d, files in ((a.from_dir, ("replay.db",)), (a.to_dir, ())):
        for f in ("server_initcwnd", "truth.csv", "requests.csv", "clients.csv", "classes.txt",
                  "cap.pcap", "flows.db") + files:
            if not os.path.isfile(os.path.join(d, f)):
                die(f"predict: {d}: no {f} there (not a run of independent.sh --server-initcwnd "
                    f"N{' with its replay' if files else ''}?)")
    if not os.path.isfile(a.predicted):
        die(f"predict: {a.predicted}: no such replay database")
    try:
        iw_from, iw_to = (int(open(os.path.join(d, "server_initcwnd")).read())
                          for d in (a.from_dir, a.to_dir))
    except ValueError as e:
        die(f"predict: server_initcwnd: not a number ({e})")
    os.makedirs(a.out, exist_ok=True)
    real_from, by_id_from = response_times(a.from_dir, os.path.join(a.from_dir, "flows.db"))
    real_to, _ = response_times(a.to_dir, os.path.join(a.to_dir, "flows.db"))
    base = replayed_times(os.path.join(a.from_dir, "replay.db"), by_id_from)
    pred = replayed_times(a.predicted, by_id_from)
    classes = [l.split()[1] for l in open(os.path.join(a.from_dir, "classes.txt")) if l.strip()]
    every = sorted(set(real_from) | set(real_to), key=int)
    groups = {c: [k for k in every if (real_from.get(k) or real_to.get(k))[0] == c] for c in classes}
    groups["all"] = every
    rows = {g: prediction_row(real_from, real_to, base, pred, conns) for g, conns in groups.items()}
    # the same on the network's part of the response time (the server's time taken out of
    # every run): the servers' own delays are the prediction's input, not its output, and on a
    # loaded host they differ between the two real runs
    net = [{k: (v[0], v[2]) for k, v in m.items()} for m in (real_from, real_to, base, pred)]
    rows_net = {g: prediction_row(*net, conns) for g, conns in groups.items()}
    delays = {f"real_iw{iw_from}": server_delays(os.path.join(a.from_dir, "flows.db")),
              f"real_iw{iw_to}": server_delays(os.path.join(a.to_dir, "flows.db")),
              f"replay_iw{iw_from}": server_delays(os.path.join(a.from_dir, "replay.db")),
              f"predicted_iw{iw_to}": server_delays(a.predicted)}
    flights = {f"iw{iw}": flight_check(d, iw) for iw, d in ((iw_from, a.from_dir), (iw_to, a.to_dir))}
    cross = None
    if a.compare_json and os.path.exists(a.compare_json):
        cj = json.load(open(a.compare_json))
        for c in cj.get("comparisons") or []:
            if c.get("other") == "predicted":  # the database's file stem
                cross = c.get("ks")
    load = {}
    for name, d in (("from", a.from_dir), ("to", a.to_dir)):
        for k in ("start", "end"):
            lp = os.path.join(d, f"loadavg-{k}")
            if os.path.exists(lp):
                load[f"{name}_{k}"] = open(lp).read().strip()
    per_conn = []
    for k in every:
        cls = (real_from.get(k) or real_to.get(k))[0]
        v = [m.get(k, (None, None))[1] for m in (real_from, real_to, base, pred)]
        dr = None if None in (v[0], v[1]) else v[1] - v[0]
        dp = None if None in (v[2], v[3]) else v[3] - v[2]
        sv = [None if k not in m else m[k][1] - m[k][2] for m in (real_from, real_to, base, pred)]
        per_conn.append((k, cls, *v, dr, dp, *sv))
    doc = dict(initcwnd_from=iw_from, initcwnd_to=iw_to, from_dir=a.from_dir, to_dir=a.to_dir,
               predicted=a.predicted, host_loadavg=load, first_flights=flights,
               mimic_compare_ks_predicted_vs_real_to=cross, server_delays=delays, groups=rows,
               groups_network_part=rows_net)
    write_atomic(os.path.join(a.out, "prediction.json"),
                 json.dumps(doc, indent=1, default=str) + "\n")
    write_csv_atomic(os.path.join(a.out, "prediction.csv"),
                     ["truth_conn", "class", f"real_iw{iw_from}_us", f"real_iw{iw_to}_us",
                      f"replay_iw{iw_from}_us", f"predicted_iw{iw_to}_us", "shift_real_us",
                      "shift_predicted_us", f"server_time_real_iw{iw_from}_us",
                      f"server_time_real_iw{iw_to}_us", f"server_time_replay_iw{iw_from}_us",
                      f"server_time_predicted_iw{iw_to}_us"], per_conn)
    text = render_prediction(doc)
    write_atomic(os.path.join(a.out, "prediction.txt"), text)
    print(text, end="")


def fmt_ms(x):
    return "-" if x is None else f"{x:.1f}"


def render_prediction(doc):
    f, t = doc["initcwnd_from"], doc["initcwnd_to"]

    def ms(x, w=8):
        return f"{x / 1000:+{w}.1f}" if x is not None else " " * (w - 1) + "-"

    def ks(k):
        return f"{k['d']:.3f} ({k['p_value']:.2g})" if k else "-"

    out = [f"independent testbed: prediction of the server's initcwnd {f} -> {t} (Monkey 5.2)",
           f"real: the same seeded workload run at initcwnd {f} and at {t}; predicted: the "
           f"initcwnd {f} capture analyzed and replayed with --stack initcwnd={t};",
           f"shift: median at {t} - median at {f} (predicted: against the replay at {f}, its "
           f"own baseline; [95% paired bootstrap]); KS D (asymptotic p); the 15% criterion is "
           f"measurable where the real shift's 95% interval lies within 15% of it",
           ]

    def ci_s(c):
        return f"[{c[0] / 1000:+.1f},{c[1] / 1000:+.1f}]" if c else ""

    def table(groups):
        rows = [f"{'class':14} {'conns':>5} {'KS pred/real':>14} {'KS real/real':>14} "
                f"{'median real ' + str(f) + '/' + str(t) + ' ms':>22} {'shift real ms':>26} "
                f"{'shift pred ms':>26} {'ratio':>6}  verdict"]
        for g, r in groups.items():
            m = r["median_us"]
            ci, cp = r["median_shift_real_ci95_us"], r["median_shift_predicted_ci95_us"]
            verdict = ("KS ok" if r["ks_ok"] else "KS > 0.05") + ", " + (
                "shift within 15%" if r["shift_within_15"] else "shift off by > 15%"
                if r["shift_measurable"] else "15% not measurable") + (
                "" if r["predicted_shift_in_real_ci95"] is None else
                ", pred in real's 95%" if r["predicted_shift_in_real_ci95"] else
                ", pred outside real's 95%")
            med = (f"{m['real_from'] / 1000:.1f}/{m['real_to'] / 1000:.1f}"
                   if None not in (m["real_from"], m["real_to"]) else "-")
            ratio = format(r["shift_ratio"], "6.2f") if r["shift_ratio"] is not None else "     -"
            rows.append(f"{g:14} {r['connections']['real_to']:5} "
                        f"{ks(r['ks_predicted_vs_real_to']):>14} "
                        f"{ks(r['ks_real_from_vs_real_to']):>14} {med:>22} "
                        f"{ms(r['median_shift_real_us'])} {ci_s(ci):>17} "
                        f"{ms(r['median_shift_predicted_us'])} {ci_s(cp):>17} {ratio}  {verdict}")
        return rows

    out += table(doc["groups"])
    if doc.get("groups_network_part"):
        out.append("")
        out.append("the same on the network's part: each run's response times less its servers' "
                   "response and query delays (as analyzed in that run)")
        out += table(doc["groups_network_part"])
    sd = doc.get("server_delays") or {}
    if sd:
        out.append("")
        out.append("server response delays per run (analyzed), p50 / p90 ms (exchanges over "
                   "100 ms): " + "; ".join(
                       f"{run}: " + ", ".join(
                           f"{srv} {fmt_ms(v['p50_ms'])}/{fmt_ms(v['p90_ms'])} ({v['over_100ms']})"
                           for srv, v in d.items() if srv == "all" or run.startswith("real"))
                       for run, d in sd.items()))
    a = doc["groups"]["all"]
    out.append(f"predicted shift against the original itself (not the replay's baseline): "
               f"{ms(a['median_shift_predicted_vs_original_us'], 0)} ms; the replay at {f} against "
               f"the original: KS D {ks(a['ks_replay_from_vs_real_from'])}")
    cx = doc.get("mimic_compare_ks_predicted_vs_real_to")
    if cx:
        out.append(f"mimic compare (same distributions, {cx.get('method', '')} p): KS D "
                   f"{cx['d']:.3f} (p {cx['p_value']:.2g})")
    for name, fl in doc["first_flights"].items():
        out.append(f"initial window at the tap, server at initcwnd {fl['initcwnd']}: max(sent - 2 x "
                   f"acked packets) over {fl['connections']} connections whose first response is "
                   f"over {2 * fl['initcwnd'] + 2} segments: " +
                   ", ".join(f"{k}: {v}" for k, v in fl["flights"].items()) +
                   f" ({fl['initcwnd']} + 1 or 2: tail loss probes)")
    ld = doc.get("host_loadavg") or {}
    if ld:
        out.append("host load average (1/5/15 min), run at " + str(f) + ": " +
                   f"{ld.get('from_start', '-')} -> {ld.get('from_end', '-')}, run at {t}: "
                   f"{ld.get('to_start', '-')} -> {ld.get('to_end', '-')}")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", required=True)
    p.add_argument("--www", required=True, help="folder of the files nginx serves")
    p.add_argument("--connections", type=int, default=2000)
    p.add_argument("--classes", default="")
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--no-delay", action="store_true")
    p.add_argument("--fast-shaper", choices=SHAPERS, default="htb",
                   help=f"the shaper of classes over {FAST_SHAPER_ABOVE_BPS // 1_000_000} Mbit/s")
    p.add_argument("--fast-addrs", type=int, default=0,
                   help=f"client addresses of each class over {FAST_SHAPER_ABOVE_BPS // 1_000_000} "
                        f"Mbit/s (default: --addrs)")
    p.add_argument("--addrs", type=int, default=ADDRS_PER_CLASS,
                   help="client addresses per class (connections at once per class)")
    p = sub.add_parser("query-server")
    p.add_argument("--addr", default=SERVER_IP)
    p.add_argument("--port", type=int, default=QUERY_PORT)
    p.add_argument("--log", required=True)
    p = sub.add_parser("clients")
    p.add_argument("--dir", required=True)
    p.add_argument("--seed", type=int, default=18)
    p.add_argument("--spread", type=float, default=5.0, help="seconds over which addresses start")
    p.add_argument("--gap", type=float, default=0.3, help="mean pause between an address's connections (s)")
    p = sub.add_parser("departures")
    p.add_argument("--pcap", required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--tick-ms", type=float, default=1.0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("shaping-check")
    p.add_argument("--dir", required=True)
    p.add_argument("--www", required=True)
    p.add_argument("--ports", default="40000-40999", help="client ports of the downloads")
    p = sub.add_parser("report")
    p.add_argument("--dir", required=True)
    p.add_argument("--flows", required=True)
    p.add_argument("--replay")
    p.add_argument("--compare-json")
    p.add_argument("--out", required=True)
    p.add_argument("--no-delay", action="store_true")
    p = sub.add_parser("predict")
    p.add_argument("--from-dir", required=True, help="the run at the initial window FROM, replayed")
    p.add_argument("--to-dir", required=True, help="the run at the initial window TO")
    p.add_argument("--predicted", required=True, help="the FROM capture replayed at TO")
    p.add_argument("--compare-json")
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    {"plan": cmd_plan, "query-server": cmd_query_server, "clients": cmd_clients,
     "report": cmd_report, "departures": cmd_departures,
     "shaping-check": cmd_shaping_check, "predict": cmd_predict}[a.cmd](a)


if __name__ == "__main__":
    main()
