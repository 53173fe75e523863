#!/usr/bin/env python3
"""The shared cache ([cluster] cache = "static") side by side with independent caches (cache = "off"), in one run.

Four `strata serve` agents on loopback in front of one S3 origin (moto), with a counting HTTP proxy between the
agents and the origin (threaded, in this script: it records every request's method, key, Range and the bytes
it sent, and with --rate-mibps limits their total throughput with a token bucket, as one origin link would).

1. Egress: the 4 agents each read the whole data set once, concurrently, cold (fresh data dirs each round);
   origin bytes / data set (target: shared <= 1.02, independent ~4.0) and origin GETs per block (shared <= 1.0:
   one GET covers a run of an agent's own consecutive blocks).
2. Fan-out: origin rate-limited; a cold epoch through 4 shared agents (each reads the whole data set) vs one
   agent alone reading it once (time ratio, target <= 1.15), and through 4 independent agents (~4x). Rounds
   rotate the order of the three; medians are reported.
3. Node loss: the readers of each of 4 shared agents read the data set; one agent is SIGKILLed at ~50% of the
   epoch; the readers of the 3 others count errors (target 0) and record each object read's latency; then a
   second epoch through the 3 survivors: its origin bytes vs the killed agent's share (target <= 1.05x share).
4. Balance: each member's sampled `share` in GET /v1/cluster, and each agent's measured share of the data set's
   origin bytes (max / mean).
5. Hot reads of one-block objects through the agent that owns the block vs through one that does not (first
   read: one peer hop, then its own copy), and peak RSS (VmHWM) of every agent vs RAM tier + in-flight budget +
   150 MiB.

The agents' API ports are picked once and kept for every phase, so every shared phase has the same placement
(the member ids are the addresses) and the per-agent shares measured in phase 1 hold in phase 3.

    .venv/bin/python bench/shared_cache.py [--size-mib 2048] [--objects N] [--rounds 3] [--rate-mibps 100,40]
        [--bin PATH] [--phases egress,fanout,loss,hot] [--peer-timeout-ms MS] [--skip-independent-fanout]
        [--keep-logs]

Results go to bench/out/shared_cache.json. On a 2-vCPU VM 1 GiB with 3 rounds takes about 10 minutes.

Needs .venv (scripts/test.sh makes it) and a build of `strata` (--bin, STRATA_BENCH_BIN, else
target/release/strata).
"""
import argparse
import concurrent.futures
import hashlib
import http.client
import http.server
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import cpu_seconds, free_port, peak_rss_mib, wait_port  # noqa: E402

MIB = 1 << 20
BLOCK = 8 * MIB
RAM_MIB, INFLIGHT_MIB = 1024, 512
RSS_BOUND_MIB = RAM_MIB + INFLIGHT_MIB + 150
BUCKET = "bench"
AK, SK = "bench", "bench-secret"
TOKEN = "shared-cache-bench-admin-token-0123456789"
SECRET = "shared-cache-bench-cluster-secret-0123"
STRATA = None  # set in main()
N_AGENTS = 4


# ---------------------------------------------------------------------------------------------------------------
# The origin: moto behind a counting, optionally rate-limiting proxy


class TokenBucket:
    """Total throughput of every stream through the proxy at most `rate` bytes/s (virtual-time reservation:
    each chunk reserves its bytes and sleeps until its slot; bursts of at most `burst` bytes)."""

    def __init__(self, rate, burst):
        self.rate, self.burst = float(rate), float(burst)
        self.tokens = self.burst
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class CountingProxy:
    """A threaded HTTP/1.1 forwarder to moto that records every request (method, key, Range, status, bytes sent,
    start and end time) and streams bodies in 256 KiB chunks, through the token bucket when one is set."""

    CHUNK = 256 * 1024

    def __init__(self, upstream_port):
        self.up_port = upstream_port
        self.lock = threading.Lock()
        self.log = []
        self.bucket = None
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def forward(self):
                t0 = time.perf_counter()
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive", "proxy-connection")}
                up = http.client.HTTPConnection("127.0.0.1", proxy.up_port, timeout=300)
                sent, status = 0, 0
                try:
                    up.request(self.command, self.path, body=body, headers=headers)
                    resp = up.getresponse()
                    status = resp.status
                    rheaders = resp.getheaders()
                    length = resp.getheader("Content-Length")
                    data = None
                    if self.command != "HEAD" and length is None:
                        data = resp.read()  # chunked: collect (small answers: errors, listings)
                        length = str(len(data))
                    self.send_response_only(status)
                    for k, v in rheaders:
                        if k.lower() not in ("transfer-encoding", "connection", "keep-alive", "content-length"):
                            self.send_header(k, v)
                    if length is not None:
                        self.send_header("Content-Length", length)
                    self.end_headers()
                    if self.command != "HEAD":
                        if data is not None:
                            self.wfile.write(data)
                            sent = len(data)
                        else:
                            left = int(length)
                            while left > 0:
                                chunk = resp.read(min(proxy.CHUNK, left))
                                if not chunk:
                                    break
                                if proxy.bucket is not None:
                                    proxy.bucket.take(len(chunk))
                                self.wfile.write(chunk)
                                sent += len(chunk)
                                left -= len(chunk)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True  # the agent went away (killed, or it dropped the read)
                finally:
                    up.close()
                    u = urllib.parse.urlsplit(self.path)
                    with proxy.lock:
                        proxy.log.append({
                            "method": self.command, "path": urllib.parse.unquote(u.path), "query": u.query,
                            "range": self.headers.get("Range"), "status": status, "bytes": sent,
                            "t0": t0, "t1": time.perf_counter(),
                        })

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # an agent killed or closing mid-request: counted in the log, nothing to print

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 128
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set_rate(self, mibps):
        self.bucket = TokenBucket(mibps * MIB, 4 * self.CHUNK) if mibps else None

    def take(self):
        """The log so far, and a fresh one."""
        with self.lock:
            out, self.log = self.log, []
        return out

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def origin_summary(log, objects):
    """Origin traffic on the data set's keys: GETs, bytes, HEADs, and how often each block was requested (a
    ranged GET counts for every block its Range covers; a GET without Range for the whole object)."""
    sizes = {f"/{BUCKET}/{k}": v["size"] for k, v in objects.items()}
    gets = heads = other = 0
    nbytes = 0
    per_block = {}
    for e in log:
        if e["path"] not in sizes:
            other += 1
            continue
        if e["method"] == "HEAD":
            heads += 1
            continue
        if e["method"] != "GET":
            other += 1
            continue
        gets += 1
        nbytes += e["bytes"]
        size = sizes[e["path"]]
        a, b = 0, size - 1
        if e["range"] and e["range"].startswith("bytes="):
            lo, _, hi = e["range"][6:].partition("-")
            a = int(lo) if lo else max(0, size - int(hi))
            b = min(size - 1, int(hi)) if hi and lo else size - 1
        for i in range(a // BLOCK, b // BLOCK + 1):
            per_block[(e["path"], i)] = per_block.get((e["path"], i), 0) + 1
    blocks = sum((v["size"] + BLOCK - 1) // BLOCK for v in objects.values())
    return {
        "gets": gets, "bytes": nbytes, "heads": heads, "other_requests": other,
        "blocks": blocks, "blocks_requested": len(per_block),
        "blocks_requested_twice_or_more": sum(1 for c in per_block.values() if c > 1),
        "block_requests": sum(per_block.values()),
    }


# ---------------------------------------------------------------------------------------------------------------
# Agents


class Agent:
    """One `strata serve` with a fresh data dir; its API port is fixed for the whole run (its member id)."""

    def __init__(self, work, slot, api_port, s3_port, peers, cache_mode, endpoint, disk_mib, tag, extra=""):
        self.slot = slot
        self.dir = os.path.join(work, f"{tag}-agent{slot}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.api = f"http://127.0.0.1:{api_port}"
        self.cfg = os.path.join(self.dir, "strata.toml")
        self.log_path = os.path.join(self.dir, "agent.log")
        with open(self.cfg, "w") as f:
            f.write(f"""
data_dir = "{self.dir}/data"
[api]
listen = "127.0.0.1:{api_port}"
[gateway]
listen = "127.0.0.1:{s3_port}"
[cache]
ram_capacity = "{RAM_MIB}MiB"
disk_capacity = "{disk_mib}MiB"
inflight_budget = "{INFLIGHT_MIB}MiB"
block_size = "{BLOCK // MIB}MiB"
[[backends]]
name = "default"
url = "s3://{BUCKET}"
[backends.options]
endpoint = "{endpoint}"
access_key_id = "{AK}"
secret_access_key = "{SK}"
region = "us-east-1"
[cluster]
cache = "{cache_mode}"
peers = {json.dumps(peers)}
{extra}
""")
        env = dict(os.environ, STRATA_LOG=os.environ.get("STRATA_BENCH_LOG", "warn"), STRATA_CLUSTER_SECRET=SECRET,
                   STRATA_ADMIN_TOKEN=TOKEN)
        for k in ("STRATA_CONFIG", "STRATA_DATA_DIR", "STRATA_API_LISTEN", "STRATA_S3_LISTEN", "STRATA_CATALOG",
                  "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            env.pop(k, None)
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([STRATA, "serve", "--config", self.cfg], stdout=self.logf,
                                     stderr=subprocess.STDOUT, env=env)
        self.peak = 0.0
        self.cpu = 0.0

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.slot} exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                urllib.request.urlopen(f"{self.api}/healthz", timeout=1).read()
                return self
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"agent {self.slot} did not start:\n{self.tail()}")
                time.sleep(0.05)

    def tail(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-3000:].decode(errors="replace")
        except OSError:
            return ""

    def get_json(self, path):
        req = urllib.request.Request(f"{self.api}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def counters(self):
        """The agent's own view of its traffic: /v1/cluster (peer path) and /v1/cache (fills)."""
        c, s = self.get_json("/v1/cluster"), self.get_json("/v1/cache")
        out = dict(c["cache"])
        for k in ("asked", "errors", "corrupt", "refused", "suspected", "moved", "move_asks"):
            out[k] = c.get(k, 0)
        for k in ("fills", "fill_requests", "fill_bytes", "fill_errors", "single_flight_joins", "misses"):
            out[k] = s.get(k, 0)
        out["disk_faults"] = s.get("disk_faults")
        return out

    def rss(self):
        if self.proc.poll() is None:
            self.peak = max(self.peak, peak_rss_mib(self.proc.pid))
            self.cpu = cpu_seconds(self.proc.pid)
        return self.peak

    def cpu_now(self):
        """CPU seconds (user + system) the agent has used so far (its last value once it is gone)."""
        self.rss()
        return self.cpu

    def kill(self):
        self.rss()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self, keep_log=False):
        self.rss()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        if not keep_log:
            shutil.rmtree(self.dir, ignore_errors=True)


class Fleet:
    """The agents of one measurement, started together, closed together."""

    def __init__(self, ctx, mode, slots, tag):
        self.ctx = ctx
        peers = [f"127.0.0.1:{p}" for p in ctx.api_ports]
        self.agents = {}
        try:
            for s in slots:
                self.agents[s] = Agent(ctx.work, s, ctx.api_ports[s], ctx.s3_ports[s], peers, mode,
                                       ctx.proxy.url, ctx.disk_mib, tag, ctx.cluster_extra)
            for a in self.agents.values():
                a.wait_ready()
            if mode == "static" and len(slots) == len(ctx.api_ports):
                # A standing cluster: every member in contact with every other, so metadata is trusted
                # (until then an agent remembers no metadata and joins no HEAD another open sent).
                deadline = time.time() + 30
                for a in self.agents.values():
                    while time.time() < deadline and not a.get_json("/v1/cluster")["coherence"]["trusted"]:
                        time.sleep(0.1)
        except Exception:
            self.close()
            raise
        ctx.proxy.take()  # start counting from here

    def close(self):
        for a in self.agents.values():
            a.close(keep_log=self.ctx.keep_logs)
            if self.ctx.keep_logs:
                d = os.path.join(ROOT, "bench", "out", "shared_cache_logs")
                os.makedirs(d, exist_ok=True)
                shutil.copy(a.log_path, os.path.join(d, os.path.basename(a.dir) + ".log"))
                shutil.rmtree(a.dir, ignore_errors=True)
            self.ctx.rss.setdefault(a.slot, []).append(a.peak)


# ---------------------------------------------------------------------------------------------------------------
# Readers: threads reading whole objects through GET /v1/read, keep-alive, 1 MiB reads


class ReadErr(Exception):
    pass


def read_object(conn_box, api_port, key, want, verify, count=None):
    """One object through the agent, its length and (with `verify`) its CRC-32 checked; returns its length.
    `count` (a one-item list): bytes received so far, added to as they arrive. Reconnects after a failure."""
    loc = urllib.parse.quote(f"default/{key}", safe="")
    if conn_box[0] is None:
        conn_box[0] = http.client.HTTPConnection("127.0.0.1", api_port, timeout=120)
    conn = conn_box[0]
    try:
        conn.request("GET", f"/v1/read?location={loc}", headers={"Authorization": f"Bearer {TOKEN}"})
        r = conn.getresponse()
        if r.status != 200:
            body = r.read()
            raise ReadErr(f"HTTP {r.status}: {body[:200]!r}")
        n, crc = 0, 0
        buf = memoryview(bytearray(MIB))
        while True:
            got = r.readinto(buf)
            if not got:
                break
            n += got
            if count is not None:
                count[0] += got
            if verify:
                crc = zlib.crc32(buf[:got], crc)
        if n != want["size"]:
            raise ReadErr(f"{n} bytes, expected {want['size']}")
        if verify and crc != want["crc"]:
            raise ReadErr("bytes differ from the source (crc32)")
        return n
    except Exception:
        conn.close()
        conn_box[0] = None
        raise


def run_readers(agents, orders, objects, threads, verify, stop=None, progress=None):
    """Every agent's readers (`threads` each) read the keys of `orders[slot]` once. Returns [(slot, key, t0, t1,
    error or None)] and the wall time. `stop` (a set of slots): readers of those slots stop taking keys;
    `progress` (a list): gets each reader's one-item byte counter, updated as bytes arrive."""
    results, lock = [], threading.Lock()
    queues = {s: list(reversed(orders[s])) for s in agents}

    def worker(slot):
        box = [None]
        count = [0]
        if progress is not None:
            progress.append(count)
        port = int(agents[slot].api.rsplit(":", 1)[1])
        while True:
            with lock:
                if (stop is not None and slot in stop) or not queues[slot]:
                    break
                key = queues[slot].pop()
            t0 = time.perf_counter()
            err = None
            try:
                read_object(box, port, key, objects[key], verify, count)
            except Exception as e:  # noqa: BLE001 - every failed read is what is counted
                err = repr(e)[:300]
            t1 = time.perf_counter()
            with lock:
                results.append((slot, key, t0, t1, err))
        if box[0] is not None:
            box[0].close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(s,), daemon=True) for s in agents for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return results, time.perf_counter() - t0


def shuffled(keys, seed):
    k = list(keys)
    random.Random(seed).shuffle(k)
    return k


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


# ---------------------------------------------------------------------------------------------------------------
# Phases


class Ctx:
    pass


def epoch(ctx, mode, slots, tag, seed, verify=True, threads=None):
    """Fresh agents of `mode` on `slots`, each reading the whole data set once, concurrently, cold. Returns the
    origin summary, each agent's counters, the wall time and the failed reads."""
    fleet = Fleet(ctx, mode, slots, tag)
    try:
        orders = {s: shuffled(ctx.keys, seed * 100 + s) for s in slots}
        cpu0 = {s: a.cpu_now() for s, a in fleet.agents.items()}
        moto0, me0 = cpu_seconds(ctx.moto.pid), os.times()
        res, wall = run_readers(fleet.agents, orders, ctx.objects, threads or ctx.threads, verify)
        me1 = os.times()
        cpu = {"agents": sum((a.cpu_now()) - cpu0[s] for s, a in fleet.agents.items()),
               "origin": cpu_seconds(ctx.moto.pid) - moto0,
               "bench": me1.user + me1.system - me0.user - me0.system}
        time.sleep(0.2)  # the last answers' log entries
        log = ctx.proxy.take()
        counters = {s: a.counters() for s, a in fleet.agents.items()}
        shares = fleet.agents[slots[0]].get_json("/v1/cluster").get("members", [])
    finally:
        fleet.close()
    failed = [r for r in res if r[4]]
    return {"origin": origin_summary(log, ctx.objects), "counters": counters, "wall_s": wall,
            "failed": failed, "reads": len(res), "members": shares, "cpu_s": cpu}


def phase_egress(ctx, a):
    print(f"\n== 1. egress: {N_AGENTS} agents each read the data set once, cold ({a.rounds} rounds)")
    out = {"shared": [], "independent": []}
    for r in range(a.rounds):
        order = ["shared", "independent"] if r % 2 == 0 else ["independent", "shared"]
        for who in order:
            e = epoch(ctx, "static" if who == "shared" else "off", list(range(N_AGENTS)), f"egress{r}-{who}",
                      seed=r)
            o = e["origin"]
            per_agent = {s: c["origin_bytes"] for s, c in e["counters"].items()}
            out[who].append(e)
            print(f"  round {r + 1} {who:11}: origin {o['bytes'] / ctx.total:.4f}x data set ({o['bytes']} B), "
                  f"{o['gets']} GETs for {o['blocks']} blocks ({o['gets'] / o['blocks']:.3f}/block; "
                  f"{o['block_requests'] / max(1, o['gets']):.2f} blocks per GET), "
                  f"{o['heads']} HEADs, blocks requested twice+ {o['blocks_requested_twice_or_more']}, "
                  f"{e['wall_s']:.1f} s, failed reads {len(e['failed'])}/{e['reads']}; CPU s agents "
                  f"{e['cpu_s']['agents']:.1f} origin {e['cpu_s']['origin']:.1f} bench {e['cpu_s']['bench']:.1f}")
            print(f"      agents' origin_bytes {per_agent}; peer_bytes "
                  f"{ {s: c['peer_bytes'] for s, c in e['counters'].items()} }; peer asked/errors/corrupt/refused/"
                  f"suspected { {s: (c['asked'], c['errors'], c['corrupt'], c['refused'], c['suspected']) for s, c in e['counters'].items()} }")
            for f in e["failed"][:3]:
                print(f"      FAILED: agent {f[0]} {f[1]}: {f[4]}")
    return out


def phase_fanout(ctx, a, rate, with_independent):
    print(f"\n== 2. fan-out: origin limited to {rate} MiB/s; cold epochs ({a.rounds} rounds, interleaved)")
    ctx.proxy.set_rate(rate)
    kinds = [("shared4", "static", list(range(N_AGENTS))), ("single", "off", [0])]
    if with_independent:
        kinds.append(("independent4", "off", list(range(N_AGENTS))))
    times = {k: [] for k, _, _ in kinds}
    origin = {k: [] for k, _, _ in kinds}
    cpu = {k: [] for k, _, _ in kinds}
    peers_of = {k: [] for k, _, _ in kinds}
    failed = 0
    try:
        for r in range(a.rounds):
            rot = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for name, mode, slots in rot:
                # "single": one agent alone, without peers (cache = "off": the same read path, no cluster).
                e = epoch(ctx, mode, slots, f"fan{r}-{name}", seed=10 + r, verify=False)
                times[name].append(e["wall_s"])
                origin[name].append(e["origin"]["bytes"] / ctx.total)
                cpu[name].append(e["cpu_s"])
                failed += len(e["failed"])
                peer = {k: sum(c[k] for c in e["counters"].values()) for k in ("asked", "errors", "suspected", "corrupt", "refused", "move_asks", "moved")}
                dup = e["origin"]["blocks_requested_twice_or_more"]
                peers_of[name].append(dict(peer, blocks_read_twice=dup))
                print(f"  round {r + 1} {name:12}: {e['wall_s']:.2f} s, origin {origin[name][-1]:.3f}x data set, "
                      f"failed reads {len(e['failed'])}; CPU s agents {e['cpu_s']['agents']:.1f} origin "
                      f"{e['cpu_s']['origin']:.1f} bench {e['cpu_s']['bench']:.1f}"
                      + (f"; peer asks {peer['asked']} (move asks {peer['move_asks']}), errors {peer['errors']}, "
                         f"refused {peer['refused']}, suspicions {peer['suspected']}, blocks read from the origin "
                         f"twice or more {dup}" if name == "shared4" else ""))
    finally:
        ctx.proxy.set_rate(None)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"rate_mibps": rate, "times_s": times, "median_s": med, "origin_x": origin, "failed_reads": failed,
           "cpu_s": cpu, "peer": peers_of, "shared4_over_single": med["shared4"] / med["single"],
           "ideal_single_s": ctx.total / (rate * MIB)}
    line = (f"  medians: single {med['single']:.2f} s (origin-bound ideal {res['ideal_single_s']:.2f} s), "
            f"shared4 {med['shared4']:.2f} s -> {res['shared4_over_single']:.3f}x (target <= 1.15)")
    if with_independent:
        res["independent4_over_single"] = med["independent4"] / med["single"]
        line += f", independent4 {med['independent4']:.2f} s -> {res['independent4_over_single']:.2f}x"
    print(line)
    return res


def phase_loss(ctx, a, victim_share):
    victim = N_AGENTS - 1
    print(f"\n== 3. node loss: agent {victim} SIGKILLed at ~50% of a cold epoch; then an epoch through the 3 "
          f"survivors")
    res = {"victim": victim, "victim_share_bytes": victim_share}
    fleet = Fleet(ctx, "static", list(range(N_AGENTS)), "loss")
    try:
        orders = {s: shuffled(ctx.keys, 500 + s) for s in fleet.agents}
        stop, progress = set(), []
        box = {}
        th = threading.Thread(target=lambda: box.update(
            r=run_readers(fleet.agents, orders, ctx.objects, ctx.threads, True, stop=stop, progress=progress)),
            daemon=True)
        th.start()
        target = N_AGENTS * ctx.total // 2
        done = lambda: sum(c[0] for c in progress)
        while done() < target and th.is_alive():
            time.sleep(0.01)
        stop.add(victim)
        t_kill = time.perf_counter()
        res["killed_at_fraction"] = done() / (N_AGENTS * ctx.total)
        fleet.agents[victim].kill()
        print(f"  killed agent {victim} at {res['killed_at_fraction']:.0%} of the epoch's bytes")
        th.join()
        results, wall1 = box["r"]
        time.sleep(0.2)
        log1 = ctx.proxy.take()
        survivors = [s for s in fleet.agents if s != victim]
        mine = [r for r in results if r[0] in survivors]
        errs = [r for r in mine if r[4]]
        lat = lambda rs: [r[3] - r[2] for r in rs]
        pre = [r for r in mine if r[3] < t_kill]
        across = [r for r in mine if r[2] <= t_kill <= r[3]]
        post = [r for r in mine if r[2] > t_kill]
        after_kill = [r for r in mine if r[3] >= t_kill]
        c1 = {s: fleet.agents[s].counters() for s in survivors}
        o1 = origin_summary(log1, ctx.objects)
        done_keys = {s: {r[1] for r in mine if r[0] == s and not r[4]} for s in survivors}
        res["epoch1"] = {
            "survivor_reads": len(mine), "survivor_errors": len(errs), "errors": [e[4] for e in errs[:5]],
            "every_survivor_read_everything": all(len(v) == len(ctx.keys) for v in done_keys.values()),
            "lat_before_kill_p50_s": pct(lat(pre), 0.5), "lat_before_kill_p99_s": pct(lat(pre), 0.99),
            "lat_across_kill_max_s": max(lat(across), default=float("nan")), "reads_across_kill": len(across),
            "lat_after_kill_p50_s": pct(lat(post), 0.5), "lat_after_kill_p99_s": pct(lat(post), 0.99),
            "lat_from_kill_p99_s": pct(lat(after_kill), 0.99), "lat_from_kill_max_s": max(lat(after_kill), default=float("nan")),
            "origin": o1, "wall_s": wall1,
            "peer_errors": {s: c1[s]["errors"] for s in survivors},
            "suspected": {s: c1[s]["suspected"] for s in survivors},
        }
        e1 = res["epoch1"]
        print(f"  epoch 1: survivors' reads {len(mine)}, errors {len(errs)} (target 0); object read latency "
              f"p50/p99 before kill {e1['lat_before_kill_p50_s']:.2f}/{e1['lat_before_kill_p99_s']:.2f} s, "
              f"in flight at the kill max {e1['lat_across_kill_max_s']:.2f} s ({len(across)} reads), after "
              f"{e1['lat_after_kill_p50_s']:.2f}/{e1['lat_after_kill_p99_s']:.2f} s; peer errors "
              f"{e1['peer_errors']}; origin {o1['bytes'] / ctx.total:.3f}x data set")
        for e in errs[:3]:
            print(f"      FAILED: agent {e[0]} {e[1]}: {e[4]}")
        # Epoch 2: the survivors again (their caches as epoch 1 left them).
        orders2 = {s: shuffled(ctx.keys, 600 + s) for s in survivors}
        alive = {s: fleet.agents[s] for s in survivors}
        results2, wall2 = run_readers(alive, orders2, ctx.objects, ctx.threads, True)
        time.sleep(0.2)
        o2 = origin_summary(ctx.proxy.take(), ctx.objects)
        c2 = {s: fleet.agents[s].counters() for s in survivors}
        errs2 = [r for r in results2 if r[4]]
        res["epoch2"] = {
            "reads": len(results2), "errors": len(errs2), "origin": o2, "wall_s": wall2,
            "origin_bytes_by_agent": {s: c2[s]["origin_bytes"] - c1[s]["origin_bytes"] for s in survivors},
            "peer_bytes_by_agent": {s: c2[s]["peer_bytes"] - c1[s]["peer_bytes"] for s in survivors},
            "disk_faults": {s: c2[s]["disk_faults"] for s in survivors},
        }
        res["epoch2_origin_over_share"] = o2["bytes"] / victim_share if victim_share else float("nan")
        # What the loss cost in all: origin bytes of both epochs beyond one read of the data set.
        res["extra_origin_bytes"] = o1["bytes"] + o2["bytes"] - ctx.total
        res["extra_over_share"] = res["extra_origin_bytes"] / victim_share if victim_share else float("nan")
        print(f"  epoch 2 (3 survivors): origin {o2['bytes']} B = {res['epoch2_origin_over_share']:.3f}x the "
              f"killed agent's share ({victim_share} B) (target <= 1.05), errors {len(errs2)}; both epochs read "
              f"{res['extra_origin_bytes']} B beyond one data set = {res['extra_over_share']:.3f}x share")
        print(f"      epoch 2 origin bytes by agent {res['epoch2']['origin_bytes_by_agent']}, peer bytes "
              f"{res['epoch2']['peer_bytes_by_agent']}")
    finally:
        fleet.close()
    return res


def phase_hot(ctx, a):
    n = a.hot_objects
    print(f"\n== 5. hot reads of {n} one-block objects (8 MiB): owner vs non-owner")
    fleet = Fleet(ctx, "static", list(range(N_AGENTS)), "hot")
    res = {}
    try:
        ags = fleet.agents
        boxes = {s: [None] for s in ags}
        port = {s: int(ags[s].api.rsplit(":", 1)[1]) for s in ags}

        def timed(s, key):
            t0 = time.perf_counter()
            read_object(boxes[s], port[s], key, ctx.hot[key], True)
            return time.perf_counter() - t0

        owners, hop, hop_heads, owner_hot, nonowner_hot, cold_owner = {}, [], [], [], [], []
        for key in ctx.hot:
            snap = {s: ags[s].counters() for s in ags}
            ctx.proxy.take()
            t = timed(0, key)
            log = ctx.proxy.take()
            now = {s: ags[s].counters() for s in ags}
            filled = [s for s in ags if now[s]["origin_bytes"] > snap[s]["origin_bytes"]]
            if len(filled) != 1:
                print(f"  {key}: origin read by agents {filled} (expected one owner)")
                continue
            o = filled[0]
            owners[key] = o
            if o == 0:
                cold_owner.append(t)
            others = [s for s in ags if s not in (0, o)]
            n_ = others[0]
            ctx.proxy.take()
            hop.append(timed(n_, key))  # first read through a non-owner: HEAD at the origin + one peer hop
            hop_heads.extend(e["t1"] - e["t0"] for e in ctx.proxy.take() if e["method"] == "HEAD")
            if o != 0:
                timed(o, key)  # the owner's own first read (its block is in its tiers; metadata not yet)
            for _ in range(a.hot_reads):
                owner_hot.append(timed(o, key))
                nonowner_hot.append(timed(n_, key))
        for b in boxes.values():
            if b[0] is not None:
                b[0].close()
        rss = {s: ags[s].rss() for s in ags}
    finally:
        fleet.close()
    counts = {s: sum(1 for o in owners.values() if o == s) for s in range(N_AGENTS)}
    ms = lambda v, q: pct(v, q) * 1e3
    res = {"owners_by_agent": counts, "objects": len(owners),
           "owner_hot_p50_ms": ms(owner_hot, 0.5), "owner_hot_p99_ms": ms(owner_hot, 0.99),
           "nonowner_hot_p50_ms": ms(nonowner_hot, 0.5), "nonowner_hot_p99_ms": ms(nonowner_hot, 0.99),
           "nonowner_first_read_p50_ms": ms(hop, 0.5), "nonowner_first_read_p99_ms": ms(hop, 0.99),
           "origin_head_p50_ms": ms(hop_heads, 0.5), "cold_read_by_owner_p50_ms": ms(cold_owner, 0.5),
           "hot_reads_each": len(owner_hot), "rss_mib": rss}
    print(f"  owners by agent {counts}; hot 8 MiB read p50/p99: owner {res['owner_hot_p50_ms']:.1f}/"
          f"{res['owner_hot_p99_ms']:.1f} ms, non-owner (its own copy) {res['nonowner_hot_p50_ms']:.1f}/"
          f"{res['nonowner_hot_p99_ms']:.1f} ms; non-owner's first read (one peer hop + a HEAD at the origin, "
          f"{res['origin_head_p50_ms']:.1f} ms) {res['nonowner_first_read_p50_ms']:.1f}/"
          f"{res['nonowner_first_read_p99_ms']:.1f} ms; cold origin read by the owner "
          f"{res['cold_read_by_owner_p50_ms']:.1f} ms ({len(cold_owner)} objects)")
    return res


def phase_balance(ctx, egress):
    """Sampled shares from /v1/cluster and measured shares of the data set's origin bytes (shared rounds)."""
    print("\n== 4. balance")
    res = {}
    shared = egress["shared"] if egress else []
    if shared:
        members = shared[0]["members"]
        sh = [m["share"] for m in members]
        res["sampled_share"] = {m["id"]: m["share"] for m in members}
        res["sampled_max_over_mean"] = max(sh) / statistics.mean(sh)
        res["weights"] = sorted({m["weight"] for m in members})
        meas = []
        for e in shared:
            per = [e["counters"][s]["origin_bytes"] for s in range(N_AGENTS)]
            meas.append(per)
        res["measured_origin_bytes_by_agent"] = meas
        res["measured_max_over_mean"] = [max(p) / statistics.mean(p) for p in meas]
        print(f"  /v1/cluster share (sampled, 20,000 keys): {[round(x, 4) for x in sh]} -> max/mean "
              f"{res['sampled_max_over_mean']:.3f}; weights {res['weights']}")
        print(f"  measured origin bytes by agent per shared round: {meas} -> max/mean "
              f"{[round(x, 3) for x in res['measured_max_over_mean']]} ({ctx.blocks} blocks)")
    return res


# ---------------------------------------------------------------------------------------------------------------


def main():
    global STRATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048, help="size of the data set")
    ap.add_argument("--objects", type=int, default=0, help="objects in it (default: one per 32 MiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate-mibps", default="100,40",
                    help="origin limit in the fan-out phase, MiB/s; a comma-separated list runs the phase at each "
                         "(independent agents at the first only: under a limit they take 4x by arithmetic)")
    ap.add_argument("--threads", type=int, default=4, help="reader threads per agent")
    ap.add_argument("--hot-objects", type=int, default=12)
    ap.add_argument("--hot-reads", type=int, default=10)
    ap.add_argument("--phases", default="egress,fanout,loss,hot")
    ap.add_argument("--peer-timeout-ms", type=int, default=0,
                    help="[cluster] peer_timeout_ms of every agent (default: the agent's, 10000)")
    ap.add_argument("--skip-independent-fanout", action="store_true",
                    help="fan-out phase without the 4 independent agents (their time is 4x by arithmetic)")
    ap.add_argument("--keep-logs", action="store_true", help="copy every agent's log to bench/out/shared_cache_logs")
    ap.add_argument("--bin", default=os.environ.get("STRATA_BENCH_BIN") or os.path.join(ROOT, "target", "release",
                                                                                         "strata"))
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"no strata binary at {a.bin}")
    phases = set(a.phases.split(","))
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    work = tempfile.mkdtemp(prefix="strata-sharedbench-")
    # A copy: a build replacing the binary during the run must not change what half the phases measure.
    STRATA = os.path.join(work, "strata")
    shutil.copy2(a.bin, STRATA)
    with open(STRATA, "rb") as f:
        bin_sha = hashlib.sha256(f.read()).hexdigest()
    bin_mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(os.stat(a.bin).st_mtime))
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ctx = Ctx()
    ctx.work, ctx.threads, ctx.rss, ctx.keep_logs = work, a.threads, {}, a.keep_logs
    ctx.cluster_extra = f"peer_timeout_ms = {a.peer_timeout_ms}" if a.peer_timeout_ms else ""
    ctx.proxy = None
    loads = []
    stop_load = threading.Event()

    def sample_load():
        while not stop_load.wait(5):
            loads.append(os.getloadavg()[0])
    threading.Thread(target=sample_load, daemon=True).start()
    try:
        wait_port(port)
        import boto3
        from botocore.config import Config
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id=AK,
                          aws_secret_access_key=SK, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        n = a.objects or max(1, a.size_mib // 32)
        per = a.size_mib * MIB // n
        rng = random.Random(1)
        ctx.objects = {}
        ctx.hot = {}
        # Sizes just under an even share, off block boundaries: most objects end with a short block.
        specs = [(f"data/obj-{i:04d}.bin", per - rng.randint(1, min(per // 2, BLOCK // 2)) | 1) for i in range(n)]
        specs += [(f"hot/h-{i:03d}.bin", BLOCK) for i in range(a.hot_objects if "hot" in phases else 0)]

        def put(spec):
            key, size = spec
            body = os.urandom(size)
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
            return key, {"size": size, "crc": zlib.crc32(body)}
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            for key, v in ex.map(put, specs):
                (ctx.hot if key.startswith("hot/") else ctx.objects)[key] = v
        ctx.keys = sorted(ctx.objects)
        ctx.total = sum(v["size"] for v in ctx.objects.values())
        ctx.blocks = sum((v["size"] + BLOCK - 1) // BLOCK for v in ctx.objects.values())
        ctx.disk_mib = max(1024, int(ctx.total * 1.5 / MIB))
        ctx.moto = moto
        ctx.api_ports = [free_port() for _ in range(N_AGENTS)]
        ctx.s3_ports = [free_port() for _ in range(N_AGENTS)]
        ctx.proxy = CountingProxy(port)
        print(f"strata: {a.bin} (modified {bin_mtime} UTC, sha256 {bin_sha[:16]}), run from a copy")
        print(f"data set: {n} objects, {ctx.total} B ({ctx.total / MIB:.1f} MiB), {ctx.blocks} blocks of 8 MiB; "
              f"uploaded in {time.perf_counter() - t_start:.0f} s; agents: RAM {RAM_MIB} MiB, disk "
              f"{ctx.disk_mib} MiB, in-flight {INFLIGHT_MIB} MiB, {a.threads} reader threads each; load average "
              f"at start {load0[0]:.2f}")
        results = {"size_mib": a.size_mib, "objects": n, "dataset_bytes": ctx.total, "blocks": ctx.blocks,
                   "rounds": a.rounds, "binary": a.bin, "binary_sha256": bin_sha, "binary_mtime": bin_mtime,
                   "argv": sys.argv[1:]}
        egress = None
        if "egress" in phases:
            egress = phase_egress(ctx, a)
            sh = [e["origin"] for e in egress["shared"]]
            ind = [e["origin"] for e in egress["independent"]]
            results["egress"] = {
                "shared_origin_x": [o["bytes"] / ctx.total for o in sh],
                "independent_origin_x": [o["bytes"] / ctx.total for o in ind],
                "shared_gets": [o["gets"] for o in sh], "independent_gets": [o["gets"] for o in ind],
                "shared_gets_per_block": [o["gets"] / o["blocks"] for o in sh],
                "independent_gets_per_block": [o["gets"] / o["blocks"] for o in ind],
                "shared_heads": [o["heads"] for o in sh], "independent_heads": [o["heads"] for o in ind],
                "shared_blocks_requested_twice": [o["blocks_requested_twice_or_more"] for o in sh],
                "shared_wall_s": [e["wall_s"] for e in egress["shared"]],
                "independent_wall_s": [e["wall_s"] for e in egress["independent"]],
                "failed_reads": sum(len(e["failed"]) for v in egress.values() for e in v),
                "shared_counters": [e["counters"] for e in egress["shared"]],
                "independent_counters": [e["counters"] for e in egress["independent"]],
            }
            r = results["egress"]
            print(f"  => origin bytes / data set: shared {statistics.median(r['shared_origin_x']):.4f} "
                  f"(target <= 1.02), independent {statistics.median(r['independent_origin_x']):.4f} (~4.0); "
                  f"GETs per block: shared {statistics.median(r['shared_gets_per_block']):.3f}, independent "
                  f"{statistics.median(r['independent_gets_per_block']):.3f}")
            results["balance"] = phase_balance(ctx, egress)
        if "fanout" in phases:
            rates = [float(x) for x in str(a.rate_mibps).split(",") if x]
            results["fanout"] = [phase_fanout(ctx, a, r, i == 0 and not a.skip_independent_fanout)
                                  for i, r in enumerate(rates)]
        if "loss" in phases:
            share = None
            # The victim's share: its origin bytes in a shared cold epoch that read the data set once (same
            # ports, same objects: same placement).
            good = [e for e in (egress or {}).get("shared", []) if e["origin"]["bytes"] <= 1.02 * ctx.total]
            if good:
                per = [e["counters"][N_AGENTS - 1]["origin_bytes"] for e in good]
                share = statistics.median(per)
                if len(set(per)) > 1:
                    print(f"  (the victim's origin bytes differed between shared rounds: {per})")
            else:
                e = epoch(ctx, "static", list(range(N_AGENTS)), "share", seed=99)
                share = e["counters"][N_AGENTS - 1]["origin_bytes"]
            results["loss"] = phase_loss(ctx, a, share)
        if "hot" in phases:
            results["hot"] = phase_hot(ctx, a)
        peaks = {s: max(v) for s, v in ctx.rss.items()}
        results["peak_rss_mib"] = peaks
        results["rss_bound_mib"] = RSS_BOUND_MIB
        print(f"\npeak RSS (VmHWM) by agent slot, max over phases: "
              f"{ {s: round(v) for s, v in sorted(peaks.items())} } MiB; bound RAM {RAM_MIB} + in-flight "
              f"{INFLIGHT_MIB} + 150 = {RSS_BOUND_MIB} MiB -> "
              f"{'within' if max(peaks.values()) <= RSS_BOUND_MIB else 'OVER'}")
        stop_load.set()
        results["load_avg_1m"] = {"start": load0[0], "median": statistics.median(loads) if loads else None,
                                  "max": max(loads) if loads else None}
        results["runtime_s"] = time.perf_counter() - t_start
        print(f"load average (1 min) during the run: median {results['load_avg_1m']['median']}, max "
              f"{results['load_avg_1m']['max']}; runtime {results['runtime_s']:.0f} s")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "out", "shared_cache.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
    finally:
        if ctx.proxy:
            ctx.proxy.close()
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
