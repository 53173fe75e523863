"""The shared block cache end to end: several `strata serve` agents in front of one S3 origin (moto), with a
counting HTTP proxy between the agents and the origin that records every request, so "each block is read from
the origin once per cluster" is checked on the wire, not on the agents' own counters.

Covered: a cold dataset read concurrently through four agents (static membership); an agent SIGKILLed while
the others read, then restarted; a peer whose block answers are corrupted on the way; the peer route's
credentials and checks; membership from the PostgreSQL catalog (join, leave, no bytes moved by a change);
membership from a Slurm node list.
"""
import concurrent.futures
import hashlib
import http.client
import http.server
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, client, free_port, wait_port

KIB, MIB = 1024, 1024 * 1024
BLOCK = 256 * KIB
SECRET = "shared-cache-test-secret-0123456789"
# Keys a careless encoder gets wrong: spaces, '+', '%', '&', '=', '~', non-ASCII, deep paths.
UGLY = ["plain.bin", "with space/a b.bin", "plus+sign+.bin", "per%cent%20.bin", "ünïcødé/日本語 ファイル.bin",
        "amp&eq=tilde~.bin", "deep/er/and/deeper/x.bin", "sem;colon,comma.bin", "paren(s)[brackets].bin",
        "dollar$at@.bin", "quote'bang!.bin", "star*caret^.bin"]


# ---------------------------------------------------------------------------------------------------------------
# A recording HTTP proxy (agents -> origin, or agent -> agent with faults)


class Proxy:
    """A threaded HTTP/1.1 forwarder to `upstream` (host:port) that records every request: method, decoded path,
    Range, status and body length. `mutate(method, path, status, headers, body)` may return a changed body (a
    fault) for an answer."""

    def __init__(self, upstream, mutate=None):
        self.up_host, up_port = upstream.rsplit(":", 1)
        self.up_port = int(up_port)
        self.mutate = mutate
        self.lock = threading.Lock()
        self.log = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive", "proxy-connection")}
                up = http.client.HTTPConnection(proxy.up_host, proxy.up_port, timeout=120)
                try:
                    up.request(self.command, self.path, body=body, headers=headers)
                    resp = up.getresponse()
                    data = resp.read()
                    rheaders = resp.getheaders()
                    status = resp.status
                finally:
                    up.close()
                if proxy.mutate is not None and self.command == "GET":
                    data = proxy.mutate(self.command, self.path, status, dict(rheaders), data)
                with proxy.lock:
                    proxy.log.append({
                        "method": self.command,
                        "path": urllib.parse.unquote(urllib.parse.urlsplit(self.path).path),
                        "query": urllib.parse.urlsplit(self.path).query,
                        "range": self.headers.get("Range"),
                        "status": status,
                        "content_range": dict((k.lower(), v) for k, v in rheaders).get("content-range"),
                        "bytes": len(data),
                    })
                self.send_response_only(status)
                for k, v in rheaders:
                    if k.lower() in ("transfer-encoding", "connection", "keep-alive", "content-length"):
                        continue
                    self.send_header(k, v)
                if self.command == "HEAD":
                    cl = dict((k.lower(), v) for k, v in rheaders).get("content-length")
                    if cl is not None:
                        self.send_header("Content-Length", cl)
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.addr = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.addr}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def entries(self):
        with self.lock:
            return list(self.log)

    def clear(self):
        with self.lock:
            self.log.clear()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def object_gets(proxy, bucket):
    """The origin's data GETs per key: {key: [(start, end_exclusive)]} from the answers' Content-Range (a whole
    object without one)."""
    out = {}
    for e in proxy.entries():
        if e["method"] != "GET" or not e["path"].startswith(f"/{bucket}/") or e["status"] not in (200, 206):
            continue
        if "list-type" in e["query"] or "uploads" in e["query"]:
            continue
        key = e["path"][len(bucket) + 2:]
        if e["content_range"]:
            span = e["content_range"].split(" ", 1)[1].split("/", 1)[0]
            a, b = (int(x) for x in span.split("-"))
            r = (a, b + 1)
        else:
            r = (0, e["bytes"])
        assert r[1] - r[0] == e["bytes"], e
        out.setdefault(key, []).append(r)
    return out


def assert_each_byte_fetched_once(proxy, bucket, objects):
    """Every byte of `objects` ({key: bytes}) came from the origin exactly once, nothing else did."""
    gets = object_gets(proxy, bucket)
    assert sorted(gets) == sorted(objects), (sorted(set(gets) ^ set(objects)))
    for key, ranges in gets.items():
        ranges = sorted(ranges)
        for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
            assert a1 <= b0, f"{key!r}: ranges {a0}-{a1} and {b0}-{b1} overlap (read twice from the origin)"
        assert sum(b - a for a, b in ranges) == len(objects[key]), (key, ranges, len(objects[key]))
    total = sum(sum(b - a for a, b in r) for r in gets.values())
    assert total == sum(len(v) for v in objects.values())
    return total


# ---------------------------------------------------------------------------------------------------------------
# Agents


class Agent:
    """One `strata serve` of a cluster, with its own data dir, API and gateway ports; restartable."""

    def __init__(self, root, name, backend_endpoint, bucket, cluster, api_host="127.0.0.1", api_port=None,
                 extra="", env=None, disk="128MiB"):
        self.name = name
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.data = os.path.join(self.dir, "data")
        self.cfg = os.path.join(self.dir, "strata.toml")
        self.log_path = os.path.join(self.dir, "agent.log")
        self.api_host = api_host
        self.api_port = api_port or free_port()
        self.api = f"http://{api_host}:{self.api_port}"
        self.s3_port = free_port()
        self.env = dict(os.environ, STRATA_LOG="warn", STRATA_CLUSTER_SECRET=SECRET, **(env or {}))
        for k in ("STRATA_CONFIG", "STRATA_DATA_DIR", "STRATA_API_LISTEN", "STRATA_S3_LISTEN", "STRATA_CATALOG",
                  "AWS_ENDPOINT_URL"):
            self.env.pop(k, None)
        disk_cfg = f'disk_capacity = "{disk}"' if disk else "disk_enabled = false"
        with open(self.cfg, "w") as f:
            f.write(f"""
data_dir = "{self.data}"
[api]
listen = "{api_host}:{self.api_port}"
[gateway]
listen = "127.0.0.1:{self.s3_port}"
[cache]
block_size = "{BLOCK // KIB}KiB"
ram_capacity = "128MiB"
{disk_cfg}
[retry]
max_retries = 2
initial_backoff = 10
max_backoff = 100
[[backends]]
name = "default"
url = "s3://{bucket}"
[backends.options]
endpoint = "{backend_endpoint}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
region = "us-east-1"
[cluster]
{cluster}
{extra}
""")
        self.proc = None
        self.logf = None

    def start(self, wait=True):
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([STRATA, "serve", "--config", self.cfg], stdout=self.logf,
                                     stderr=subprocess.STDOUT, env=self.env)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                urllib.request.urlopen(f"{self.api}/healthz", timeout=1).read()
                return
            except (OSError, urllib.error.URLError):
                if time.time() > deadline:
                    raise RuntimeError(f"agent {self.name} did not start:\n{self.log()}")
                time.sleep(0.05)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def term(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self):
        self.kill()
        if self.logf:
            self.logf.close()
            self.logf = None

    # -- API

    def get_json(self, path):
        req = urllib.request.Request(f"{self.api}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def cluster(self):
        return self.get_json("/v1/cluster")

    def member(self, other):
        """`other`'s entry in this agent's view (None when not a member)."""
        for m in self.cluster()["members"]:
            if m["id"] == other.me:
                return m
        return None

    @property
    def me(self):
        return getattr(self, "_me", self.api)

    def read(self, key, rng=None, timeout=60):
        """The object (or `rng` = (start, end_exclusive) of it) through `GET /v1/read`."""
        loc = urllib.parse.quote(f"default/{key}", safe="")
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        if rng is not None:
            headers["Range"] = f"bytes={rng[0]}-{rng[1] - 1}"
        req = urllib.request.Request(f"{self.api}/v1/read?location={loc}", headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            assert r.status == (206 if rng else 200), r.status
        return body


class Cluster:
    """Agents started together, closed together (whatever happened in the test)."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="strata-shared-")
        self.agents = []
        self.proxies = []

    def add(self, *a, **kw):
        ag = Agent(self.root, f"agent{len(self.agents)}", *a, **kw)
        self.agents.append(ag)
        return ag

    def proxy(self, *a, **kw):
        p = Proxy(*a, **kw)
        self.proxies.append(p)
        return p

    def close(self):
        for ag in self.agents:
            try:
                ag.close()
            except Exception:
                pass
        for p in self.proxies:
            try:
                p.close()
            except Exception:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self):
        return "\n".join(f"--- {a.name}:\n{a.log()}" for a in self.agents)


@pytest.fixture()
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture()
def bucket(origin):
    """A fresh bucket at the origin, and a boto3 client of the origin (not through any proxy)."""
    s3 = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    name = f"shared-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    return name, s3


def upload(s3, bucket, objects):
    for k, v in objects.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)


def make_objects(seed, n, lo=1 * MIB, hi=3 * MIB, prefix="", keys=None):
    rng = random.Random(seed)
    names = keys or [f"obj-{i:03d}.bin" for i in range(n)]
    # Sizes off block boundaries: every object ends with a short block.
    return {f"{prefix}{k}": rng.randbytes(rng.randint(lo, hi) | 1) for k in names[:n]}


def static_cluster(c, n, endpoint, bucket, **kw):
    ports = [free_port() for _ in range(n)]
    peers = json.dumps([f"127.0.0.1:{p}" for p in ports])
    for p in ports:
        c.add(endpoint, bucket, f'peers = {peers}\ncache = "static"', api_port=p, **kw)
    for a in c.agents:
        a.start(wait=False)
    for a in c.agents:
        a.wait_ready()
    return c.agents


def md5(b):
    return hashlib.md5(b).hexdigest()


def read_all(tasks, workers=16):
    """Run `tasks` [(agent, key, range_or_None)] concurrently; returns [(task, body or exception)]."""
    def one(t):
        ag, key, rng = t
        try:
            return t, ag.read(key, rng)
        except Exception as e:  # noqa: BLE001 - a failed read is what the tests count
            return t, e
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(one, tasks))


def check_bodies(results, objects):
    """Every read succeeded and returned exactly the source bytes; returns the failures (empty)."""
    failed, bad = [], []
    for (ag, key, rng), body in results:
        if isinstance(body, Exception):
            failed.append((ag.name, key, rng, repr(body)))
            continue
        want = objects[key] if rng is None else objects[key][rng[0]:rng[1]]
        if len(body) != len(want) or md5(body) != md5(want):
            bad.append((ag.name, key, rng, len(body), len(want)))
    return failed, bad


def totals(agents, field):
    return sum(a.cluster()["cache"][field] for a in agents)


def poll(what, fn, timeout, every=0.2):
    """fn() until it returns a truthy value; its last value, or an AssertionError naming `what`."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


# ---------------------------------------------------------------------------------------------------------------
# 1. Four agents, one cold dataset, every block from the origin once


def test_four_agents_read_a_cold_dataset_each_block_from_the_origin_once(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(1, len(UGLY), keys=UGLY)
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    agents = static_cluster(cluster, 4, proxy.url, name)

    # Every agent reads every object; the four reads of an object run at the same time.
    tasks = [(a, k, None) for k in objects for a in random.Random(2).sample(agents, len(agents))]
    results = read_all(tasks, workers=16)
    failed, bad = check_bodies(results, objects)
    assert not failed, (failed[:3], cluster.logs())
    assert not bad, bad[:3]

    size = sum(len(v) for v in objects.values())
    assert_each_byte_fetched_once(proxy, name, objects)
    st = [a.cluster() for a in agents]
    for s in st:
        assert s["shared"] is True and s["membership"] == "static"
        assert len(s["members"]) == 4 and sum(m["me"] for m in s["members"]) == 1
        assert all(m["state"] == "up" for m in s["members"]), s["members"]
        assert s["errors"] == 0 and s["corrupt"] == 0 and s["refused"] == 0 and s["suspected"] == 0, s
        # Each of 4 equal members owns about a quarter of the blocks.
        assert all(0.18 < m["share"] < 0.32 for m in s["members"]), s["members"]
    cache = [s["cache"] for s in st]
    # The origin bytes the agents count are the proxy's; what peers got, peers served.
    assert sum(c["origin_bytes"] for c in cache) == size, cache
    assert sum(c["peer_blocks"] for c in cache) > 0, cache
    assert sum(c["peer_blocks"] for c in cache) == sum(c["served_to_peers"] for c in cache), cache
    assert sum(c["peer_bytes"] for c in cache) == sum(c["served_to_peers_bytes"] for c in cache), cache
    # Each agent holds all blocks now: 3/4 of what it read came from its peers.
    nblocks = sum(-(-len(v) // BLOCK) for v in objects.values())
    assert sum(c["peer_blocks"] for c in cache) == 4 * nblocks - nblocks, (cache, nblocks)
    assert sum(s["asked"] for s in st) == sum(c["peer_blocks"] for c in cache)
    v1 = [a.get_json("/v1/cache") for a in agents]
    assert [v["peer_blocks"] for v in v1] == [c["peer_blocks"] for c in cache]
    assert [v["served_to_peers"] for v in v1] == [c["served_to_peers"] for c in cache]

    # Warm now: ranged reads at odd offsets, through every agent, read nothing more from the origin.
    proxy.clear()
    rng = random.Random(3)
    ranged = []
    for k, v in objects.items():
        for a in agents:
            s = rng.randrange(len(v))
            ranged.append((a, k, (s, min(len(v), s + rng.randint(1, 700 * KIB)))))
    failed, bad = check_bodies(read_all(ranged), objects)
    assert not failed and not bad, (failed[:3], bad[:3])
    assert object_gets(proxy, name) == {}

    # The CLI shows the same members.
    out = subprocess.run([STRATA, "cluster", "status"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, STRATA_API=agents[0].api, STRATA_TOKEN=ADMIN_TOKEN))
    assert out.returncode == 0, out.stderr
    for a in agents:
        assert a.api in out.stdout, out.stdout
