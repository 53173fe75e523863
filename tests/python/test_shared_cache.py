"""The shared block cache end to end: several `strata serve` agents in front of one S3 origin (moto), with a
counting HTTP proxy between the agents and the origin that records every request, so "each block is read from
the origin once per cluster" is checked on the wire, not on the agents' own counters.

Covered: a cold dataset read concurrently through four agents (static membership); an agent SIGKILLed while
the others read, then restarted; a peer whose block answers are corrupted on the way; the peer route's
credentials and checks; membership from the PostgreSQL catalog (join, leave, no bytes moved by a change);
membership from a Slurm node list; the streaming loader on two nodes, each through its own agent.

Three tests began as reports of bugs found by them (each seen failing first): live agents stalling each other
while taking over a dead member's blocks, a joining agent re-reading blocks the members held, and agents
started at once on a fresh PostgreSQL catalog racing on its first rows.
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
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, api_get, client, free_port, poll

KIB, MIB = 1024, 1024 * 1024
BLOCK = 256 * KIB
SECRET = "shared-cache-test-secret-0123456789"
# Agents sharing a PostgreSQL catalog seal its S3 secrets with one key.
CATALOG_KEY = "5a" * 32
GW_KEY, GW_SECRET = "shared-cache-key", "shared-cache-secret-0123456789"
# Keys a careless encoder gets wrong: spaces, '+', '%', '&', '=', '~', non-ASCII, deep paths.
UGLY = ["plain.bin", "with space/a b.bin", "plus+sign+.bin", "per%cent%20.bin", "ünïcødé/日本語 ファイル.bin",
        "amp&eq=tilde~.bin", "deep/er/and/deeper/x.bin", "sem;colon,comma.bin", "paren(s)[brackets].bin",
        "dollar$at@.bin", "quote'bang!.bin", "star*caret^.bin"]


# ---------------------------------------------------------------------------------------------------------------
# A recording HTTP proxy (agents -> origin, or agent -> agent with faults)


class Proxy:
    """A threaded HTTP/1.1 forwarder to `upstream` (host:port) that records every request: method, decoded path,
    Range, status and body length. `before(method, path)` runs before a request is forwarded (a delay);
    `mutate(method, path, status, headers, body)` may return a changed body (a fault) for an answer."""

    def __init__(self, upstream, mutate=None, before=None):
        self.up_host, up_port = upstream.rsplit(":", 1)
        self.up_port = int(up_port)
        self.mutate = mutate
        self.before = before
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
                if proxy.before is not None:
                    proxy.before(self.command, self.path)
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

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client that hung up (an agent killed mid-request) is no error of the proxy

        self.server = Server(("127.0.0.1", 0), Handler)
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


def object_heads(proxy, bucket):
    """The origin's HEADs per key: {key: count}."""
    out = {}
    for e in proxy.entries():
        if e["method"] == "HEAD" and e["path"].startswith(f"/{bucket}/"):
            key = e["path"][len(bucket) + 2:]
            out[key] = out.get(key, 0) + 1
    return out


def assert_each_byte_fetched_once(proxy, bucket, objects):
    """Every byte of `objects` ({key: bytes}) came from the origin exactly once, nothing else did."""
    return assert_each_byte_fetched_once_in(object_gets(proxy, bucket), objects)


def assert_each_byte_fetched_once_in(gets, objects):
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
                 extra="", env=None, disk="128MiB", me=None, wrap=(), ram="128MiB"):
        self.name = name
        # wrap: a command the agent runs under (`unshare --mount ...`: a node of its own for mounts).
        self.wrap = list(wrap)
        # self.me: its member id as the others reach it (its advertised address when that is not its API).
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.data = os.path.join(self.dir, "data")
        self.cfg = os.path.join(self.dir, "strata.toml")
        self.log_path = os.path.join(self.dir, "agent.log")
        self.api_host = api_host
        self.api_port = api_port or free_port()
        self.api = f"http://{api_host}:{self.api_port}"
        self.me = me or self.api
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
[[gateway.keys]]
access_key = "{GW_KEY}"
secret_key = "{GW_SECRET}"
principal = "reader"
[cache]
block_size = "{BLOCK // KIB}KiB"
ram_capacity = "{ram}"
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
        if self.logf:
            self.logf.close()
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([*self.wrap, STRATA, "serve", "--config", self.cfg], stdout=self.logf,
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

    def read(self, key, rng=None, timeout=60, job=None):
        """The object (or `rng` = (start, end_exclusive) of it) through `GET /v1/read`; `job`: for team vision's
        job of that name (`x-strata-team`, `x-strata-job`)."""
        loc = urllib.parse.quote(f"default/{key}", safe="")
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        if job is not None:
            headers.update({"x-strata-team": "vision", "x-strata-job": job})
        if rng is not None:
            headers["Range"] = f"bytes={rng[0]}-{rng[1] - 1}"
        req = urllib.request.Request(f"{self.api}/v1/read?location={loc}", headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            assert r.status == (206 if rng else 200), r.status
        return body

    def s3_read(self, key, rng=None):
        """The same through the agent's S3 gateway (bucket `default`), with boto3."""
        c = client(f"http://127.0.0.1:{self.s3_port}", GW_KEY, GW_SECRET)
        kw = {"Range": f"bytes={rng[0]}-{rng[1] - 1}"} if rng is not None else {}
        return c.get_object(Bucket="default", Key=key, **kw)["Body"].read()


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
    yield name, s3
    # The origin lives for the session: give its memory back.
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=o["Key"])
    s3.delete_bucket(Bucket=name)


def upload(s3, bucket, objects):
    for k, v in objects.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v)


def make_objects(seed, n, lo=1 * MIB, hi=3 * MIB, prefix="", keys=None):
    rng = random.Random(seed)
    names = keys or [f"obj-{i:03d}.bin" for i in range(n)]
    # Sizes off block boundaries: every object ends with a short block.
    return {f"{prefix}{k}": rng.randbytes(rng.randint(lo, hi) | 1) for k in names[:n]}


def static_cluster(c, n, endpoint, bucket, extra_cluster="", **kw):
    ports = [free_port() for _ in range(n)]
    peers = json.dumps([f"127.0.0.1:{p}" for p in ports])
    for p in ports:
        c.add(endpoint, bucket, f'peers = {peers}\ncache = "static"\n{extra_cluster}', api_port=p, **kw)
    for a in c.agents:
        a.start(wait=False)
    for a in c.agents:
        a.wait_ready()
    return c.agents


def md5(b):
    return hashlib.md5(b).hexdigest()


def read_all(tasks, workers=16, via=lambda ag: ag.read):
    """Run `tasks` [(agent, key, range_or_None)] concurrently, each read with `via(agent)` (default its
    /v1/read); returns [(task, body or exception)]."""
    def one(t):
        ag, key, rng = t
        try:
            return t, via(ag)(key, rng)
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


# ---------------------------------------------------------------------------------------------------------------
# 1. Four agents, one cold dataset, every block from the origin once


def test_four_agents_read_a_cold_dataset_each_block_from_the_origin_once(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(1, len(UGLY), keys=UGLY)
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    agents = static_cluster(cluster, 4, proxy.url, name)
    # A standing cluster: every member in contact with every other, so metadata is trusted (until then an
    # agent remembers no metadata and joins no HEAD another open sent: it could have missed a write).
    for a in agents:
        poll("metadata trusted", lambda: a.cluster()["coherence"]["trusted"], 30)

    # Every agent reads every object; the four reads of an object run at the same time. Two agents are read
    # through their S3 gateway (boto3), two through the data-plane route.
    tasks = [(a, k, None) for k in objects for a in random.Random(2).sample(agents, len(agents))]
    results = read_all(tasks, workers=16, via=lambda ag: ag.s3_read if ag in agents[2:] else ag.read)
    failed, bad = check_bodies(results, objects)
    assert not failed, (failed[:3], cluster.logs())
    assert not bad, bad[:3]

    size = sum(len(v) for v in objects.values())
    assert_each_byte_fetched_once(proxy, name, objects)
    # Metadata is opened through its owner as blocks are: one HEAD per object for the cluster, not one per
    # agent (keys as the proxy saw them, quoted).
    heads = object_heads(proxy, name)
    st = [a.cluster() for a in agents]
    # An agent sends its own HEAD only when its ask to the owner failed (`meta_failed`: the owner did not answer
    # in time under load) or its metadata lease lapsed (`lapses`): safety over the saving. Extra HEADs with no
    # such cause are the bug this checks for; the causes are in the message when there are any.
    why = [{k: s[k] for k in ("meta_asked", "meta_failed", "suspected")} | {"lapses": s["coherence"]["lapses"]}
           for s in st]
    extra = sum(heads.values()) - len(objects)
    assert set(heads) == set(objects), (heads, why)
    if not any(w["lapses"] for w in why):
        assert extra <= sum(w["meta_failed"] for w in why), (sum(heads.values()), len(objects), heads, why)
    assert all(1 <= n <= len(agents) for n in heads.values()), (heads, why)
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
    failed, bad = check_bodies(read_all(ranged, via=lambda ag: ag.s3_read if ag in agents[:2] else ag.read),
                               objects)
    assert not failed and not bad, (failed[:3], bad[:3])
    assert object_gets(proxy, name) == {}

    # The CLI shows the same members.
    out = subprocess.run([STRATA, "cluster", "status"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, STRATA_API=agents[0].api, STRATA_TOKEN=ADMIN_TOKEN))
    assert out.returncode == 0, out.stderr
    for a in agents:
        assert a.api in out.stdout, out.stdout


def test_an_owner_reading_from_a_slow_origin_is_waited_for_not_taken_for_dead(origin, bucket, cluster):
    """The origin answers every GET after 1.5 s, longer than the agents' peer timeout (1 s): an owner still
    filling a block says "still reading" before the asker's timeout, and the asker waits for it. Before the fix
    the askers timed out, made healthy owners suspect and read the blocks again from the already slow origin."""
    name, s3 = bucket
    objects = make_objects(21, 3, lo=2 * BLOCK, hi=3 * BLOCK)
    upload(s3, name, objects)

    def slow(method, path):
        if method == "GET" and "list-type" not in path:
            time.sleep(1.5)

    proxy = cluster.proxy(origin.removeprefix("http://"), before=slow)
    agents = static_cluster(cluster, 2, proxy.url, name, extra_cluster="peer_timeout_ms = 1000")
    tasks = [(a, k, None) for k in objects for a in agents]
    failed, bad = check_bodies(read_all(tasks, workers=8), objects)
    assert not failed and not bad, (failed[:3], bad[:3], cluster.logs())
    assert_each_byte_fetched_once(proxy, name, objects)
    st = [a.cluster() for a in agents]
    assert all(s["errors"] == 0 and s["suspected"] == 0 for s in st), st
    assert sum(s["busy"] for s in st) > 0, st


class StateWatch:
    """Samples how `watchers` see `target` (its member state) every 50 ms in the background."""

    def __init__(self, watchers, target):
        self.watchers, self.target = watchers, target
        self.seen = {w.name: set() for w in watchers}
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop_ev.is_set():
            for w in self.watchers:
                try:
                    m = w.member(self.target)
                except Exception:  # noqa: BLE001 - a watcher busy for a moment is not what this samples
                    continue
                if m is not None:
                    self.seen[w.name].add(m["state"])
            self.stop_ev.wait(0.05)

    def stop(self):
        self.stop_ev.set()
        self.thread.join()
        return self.seen


# ---------------------------------------------------------------------------------------------------------------
# 2. An agent SIGKILLed mid-epoch, then restarted


def test_a_killed_agent_costs_no_read_and_serves_again_once_restarted(origin, bucket, cluster):
    name, s3 = bucket
    epoch = make_objects(10, 16, lo=1 * MIB, hi=2 * MIB, prefix="epoch/")
    after = make_objects(11, 10, lo=512 * KIB, hi=1536 * KIB, prefix="after/")
    final = make_objects(12, 8, lo=512 * KIB, hi=1536 * KIB, prefix="final/")
    upload(s3, name, {**epoch, **after, **final})
    proxy = cluster.proxy(origin.removeprefix("http://"))
    # peer_timeout_ms bounds what the stall of test_a_member_down_stalls_reads_... costs this test (see there).
    agents = static_cluster(cluster, 4, proxy.url, name, extra_cluster="peer_timeout_ms = 3000")
    survivors, victim = agents[:3], agents[3]

    # An epoch through the three survivors (each reads every object, in its own order); the fourth agent is
    # SIGKILLed once a quarter of the reads are done, with reads asking it in flight.
    tasks = []
    for i, a in enumerate(survivors):
        tasks += [(a, k, None) for k in random.Random(20 + i).sample(sorted(epoch), len(epoch))]
    random.Random(7).shuffle(tasks)
    done = [0]
    lock = threading.Lock()
    quarter = threading.Event()

    def one(t):
        a, k, _ = t
        try:
            body = a.read(k)
        except Exception as e:  # noqa: BLE001
            body = e
        with lock:
            done[0] += 1
            if done[0] >= len(tasks) // 4:
                quarter.set()
        return t, body

    watch = StateWatch(survivors, victim)
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(one, t) for t in tasks]
        assert quarter.wait(60), "the epoch did not get a quarter through"
        victim.kill()
        killed_after = done[0]
        results = [f.result() for f in futs]
    failed, bad = check_bodies(results, epoch)
    assert not failed, (failed[:3], cluster.logs())
    assert not bad, bad[:3]
    assert killed_after < len(tasks), "the kill came after the epoch"

    # The survivors take over the dead agent's blocks: a cold set read through all three, with no failed read,
    # every block of it read from the origin by a survivor. (That each is read only once is what
    # test_a_member_down_stalls_reads_... checks: it is not so today.)
    proxy.clear()
    failed, bad = check_bodies(read_all([(a, k, None) for k in after for a in survivors], workers=9), after)
    assert not failed and not bad, (failed[:3], bad[:3], cluster.logs())
    gets = object_gets(proxy, name)
    for k, v in after.items():
        covered = set()
        for b0, b1 in gets.get(k, []):
            covered.update(range(b0, b1))
        assert len(covered) == len(v), k
    seen = watch.stop()
    for a in survivors:
        s = a.cluster()
        # Its first failed request may have been a block's or a metadata request's (it owns keys' metadata too).
        assert s["errors"] + s["meta_failed"] > 0 and s["suspected"] > 0, (a.name, s)
        assert s["corrupt"] == 0, s
        assert "suspect" in seen[a.name], (a.name, seen)
        assert s["cache"]["peer_blocks"] > 0

    # Restarted on the same config and data dir, it is asked again: as soon as a survivor's backoff for it
    # runs out (at most 30 s) its next answer clears the suspicion. Poll with fresh cold objects, each read
    # through every survivor, until it has served peers again and every survivor sees it up.
    victim.start()
    assert victim.cluster()["cache"]["served_to_peers"] == 0
    deadline = time.time() + 60
    n = 0
    while True:
        fresh = make_objects(100 + n, 1, lo=MIB, hi=MIB + 4 * KIB, prefix=f"poll/{n}-")
        n += 1
        upload(s3, name, fresh)
        failed, bad = check_bodies(read_all([(a, k, None) for k in fresh for a in survivors]), fresh)
        assert not failed and not bad, (failed, bad)
        states = {a.name: a.member(victim)["state"] for a in survivors}
        served = victim.cluster()["cache"]["served_to_peers"]
        if served > 0 and all(v == "up" for v in states.values()):
            break
        assert time.time() < deadline, f"restarted agent not back: served {served}, states {states}"
    # Every agent sees every member up (a suspicion among the survivors runs out by itself).
    poll("every member up everywhere",
         lambda: all(m["state"] == "up" for a in agents for m in a.cluster()["members"]), timeout=40)
    # Back for good: a cold set through all four is read from the origin once, the restarted agent serves
    # the others its share, and no peer request fails.
    errors = [a.cluster()["errors"] for a in agents]
    served = victim.cluster()["cache"]["served_to_peers"]
    proxy.clear()
    failed, bad = check_bodies(read_all([(a, k, None) for k in final for a in agents]), final)
    assert not failed and not bad, (failed[:3], bad[:3])
    assert_each_byte_fetched_once(proxy, name, final)
    assert [a.cluster()["errors"] for a in agents] == errors
    assert victim.cluster()["cache"]["served_to_peers"] > served
    assert victim.cluster()["cache"]["peer_blocks"] > 0


def test_a_member_down_stalls_reads_and_makes_live_peers_suspect(origin, bucket, cluster):
    """Two live agents and a third member that is down; each object read through both live agents at once.
    Peer requests are delayed 0.3 s on the way (a proxy in front of each live agent), so that each agent has
    started its own fill of the object before the other's requests reach it: the wait cycle is then certain
    instead of a race (the race is hit about one run in four in test_a_killed_agent_... without the delay).
    Without the member that is down the same setup reads each object in 0.4 s, each block once."""
    name, s3 = bucket
    objects = make_objects(50, 6, lo=2 * MIB, hi=2 * MIB + 1000, prefix="x/")
    upload(s3, name, objects)
    origin_proxy = cluster.proxy(origin.removeprefix("http://"))
    ports = [free_port(), free_port()]

    def delay(method, path):
        if path.startswith("/v1/peer/blocks"):
            time.sleep(0.3)

    fronts = [cluster.proxy(f"127.0.0.1:{p}", before=delay) for p in ports]
    down = f"127.0.0.1:{free_port()}"  # a member nothing listens for
    peers = json.dumps([f.addr for f in fronts] + [down])
    timeout = 2.0
    live = []
    for p, f in zip(ports, fronts):
        a = cluster.add(origin_proxy.url, name, f'peers = {peers}\ncache = "static"\n'
                        f'peer_timeout_ms = {int(timeout * 1000)}\nadvertise = "{f.addr}"', api_port=p, me=f.url)
        live.append(a)
    for a in live:
        a.start()
    a, b = live
    watch = StateWatch([a], b)
    watch_b = StateWatch([b], a)

    def both(k):
        bar = threading.Barrier(2)
        out = []

        def r(ag):
            bar.wait()
            t = time.time()
            body = ag.read(k)
            out.append((ag.name, time.time() - t, md5(body) == md5(objects[k])))
        ts = [threading.Thread(target=r, args=(ag,)) for ag in live]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return k, out

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        lat = list(ex.map(both, objects))
    seen = {**watch.stop(), **watch_b.stop()}
    assert all(ok for _, out in lat for _, _, ok in out), lat
    # What sharing promises: each block from the origin once, no live peer ever suspect, no read waiting for
    # a peer's timeout.
    assert seen == {a.name: {"up"}, b.name: {"up"}}, seen
    slow = [(k, n, round(t, 2)) for k, out in lat for n, t, _ in out if t >= timeout]
    assert not slow, f"reads that waited for the peer timeout ({timeout} s): {slow}"
    assert_each_byte_fetched_once(origin_proxy, name, objects)


# ---------------------------------------------------------------------------------------------------------------
# 3. A peer whose block answers are damaged on the way


@pytest.mark.parametrize("fault", ["flip", "truncate"])
def test_corrupted_peer_answers_are_dropped_and_read_from_the_origin(origin, bucket, cluster, fault):
    name, s3 = bucket
    objects = make_objects(30, 8, lo=1 * MIB, hi=2 * MIB)
    upload(s3, name, objects)
    origin_proxy = cluster.proxy(origin.removeprefix("http://"))
    damaged = []

    def mutate(method, path, status, headers, body):
        if path.startswith("/v1/peer/blocks") and status == 200 and body:
            damaged.append((path, len(body)))
            if fault == "flip":
                b = bytearray(body)
                b[len(b) // 2] ^= 0x5A
                return bytes(b)
            return body[: len(body) // 2]
        return body

    a_port, b_port = free_port(), free_port()
    # B is reached by the others through the fault proxy only: that is its advertised address.
    fault_proxy = cluster.proxy(f"127.0.0.1:{b_port}", mutate=mutate)
    peers = json.dumps([f"127.0.0.1:{a_port}", fault_proxy.addr])
    a = cluster.add(origin_proxy.url, name, f'peers = {peers}\ncache = "static"', api_port=a_port)
    b = cluster.add(origin_proxy.url, name, f'peers = {peers}\ncache = "static"\nadvertise = "{fault_proxy.addr}"',
                    api_port=b_port, me=fault_proxy.url)
    a.start()
    b.start()
    assert b.cluster()["me"] == fault_proxy.url

    watch = StateWatch([a], b)
    failed, bad = check_bodies(read_all([(a, k, None) for k in objects], workers=8), objects)
    seen = watch.stop()
    assert not failed, (failed[:3], cluster.logs())
    assert not bad, bad[:3]
    size = sum(len(v) for v in objects.values())
    sa, sb = a.cluster(), b.cluster()
    assert damaged, "A never asked B for a block"
    # Every damaged answer was caught (none was delivered: the bytes above are right), B became suspect.
    assert sa["corrupt"] == len(damaged), (sa, len(damaged))
    # (Suspect for a backoff that starts at 1 s: the state may be over before a poll sees it; the counter
    # keeps the record.)
    assert sa["suspected"] >= 1, (sa, seen)
    assert sa["cache"]["peer_blocks"] == 0 and sa["cache"]["peer_bytes"] == 0, sa
    # A read every block from the origin itself (B's copies were dropped); B read from the origin exactly the
    # blocks it served.
    assert sa["cache"]["origin_bytes"] == size, sa
    assert sb["cache"]["served_to_peers"] == len(damaged), sb
    assert sb["cache"]["served_to_peers_bytes"] == sum(n for _, n in damaged), sb
    # A block asked again (each request names the block; a new owner asks the one before it after a view
    # change) is served from B's cache the second time: B's origin reads are the distinct blocks it served.
    # A block is named by its object and index; the rest of the query (`fill=0` when the asker only looks for
    # a copy, `fill=1` when it asks the owner to fill) varies, so requests are told apart by those two.
    def block_of(path):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        return (q["key"][0], q["index"][0])
    distinct = {block_of(p): n for p, n in damaged}
    assert sb["cache"]["origin_bytes"] == sum(distinct.values()), (sb, sa, len(damaged), len(distinct))
    gets = object_gets(origin_proxy, name)
    assert sum(b1 - b0 for r in gets.values() for b0, b1 in r) == size + sb["cache"]["origin_bytes"]
    for k, v in objects.items():
        covered = set()
        for b0, b1 in gets[k]:
            covered.update(range(b0 // BLOCK, -(-b1 // BLOCK)))
        assert covered == set(range(-(-len(v) // BLOCK))), k


# ---------------------------------------------------------------------------------------------------------------
# 4. The peer route: who may ask, and for exactly what


def raw(agent, path, headers=None):
    """(status, headers, body) of a GET on the agent's API, errors included."""
    req = urllib.request.Request(f"{agent.api}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def cli(agent, *args):
    r = subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, STRATA_API=agent.api, STRATA_TOKEN=ADMIN_TOKEN))
    assert r.returncode == 0, f"strata {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout


def test_the_peer_route_takes_only_the_cluster_key_and_serves_only_the_version_asked(origin, bucket, cluster):
    name, s3 = bucket
    objects = {"open/data.bin": random.Random(40).randbytes(3 * BLOCK + 1000),
               "vision/secret.bin": random.Random(41).randbytes(2 * BLOCK + 7)}
    upload(s3, name, objects)
    (a,) = static_cluster(cluster, 1, origin, name)
    head = s3.head_object(Bucket=name, Key="open/data.bin")
    backend_id = f"s3://{name}/@{origin}"

    def q(key="open/data.bin", index=1, etag=head["ETag"], backend=backend_id, block_size=BLOCK, fill=1, **kw):
        h = s3.head_object(Bucket=name, Key=key)
        p = {"backend": backend, "key": key, "size": h["ContentLength"],
             "mtime": int(h["LastModified"].timestamp()), "index": index, "block_size": block_size,
             "etag": etag if key == "open/data.bin" else h["ETag"], "fill": fill}
        p.update(kw)
        return "/v1/peer/blocks?" + urllib.parse.urlencode(p)

    key = {"x-strata-cluster-key": SECRET}
    want = objects["open/data.bin"][BLOCK:2 * BLOCK]
    # No credential; a token, even the administrator's; a wrong cluster key.
    assert raw(a, q())[0] == 401
    s, _, body = raw(a, q(), {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert s == 403 and want not in body, (s, body[:200])
    assert raw(a, q(), {"x-strata-cluster-key": "not-the-secret-0123456789"})[0] == 401
    assert raw(a, q(), {"x-strata-cluster-key": SECRET[:-1]})[0] == 401
    # The cluster key is no token elsewhere.
    assert raw(a, "/v1/cluster", key)[0] == 401
    # Not held and no fill asked: 404; then filled; then held.
    assert raw(a, q(fill=0), key)[0] == 404
    s, h, body = raw(a, q(), key)
    assert s == 200 and body == want, (s, body[:200])
    hexes = {k.lower(): v for k, v in h.items()}["x-strata-blake3"]
    assert len(hexes) == 64 and int(hexes, 16) >= 0
    s, h2, body = raw(a, q(fill=0), key)
    assert s == 200 and body == want and {k.lower(): v for k, v in h2.items()}["x-strata-blake3"] == hexes
    # The last, short block.
    s, _, body = raw(a, q(index=3), key)
    assert s == 200 and body == objects["open/data.bin"][3 * BLOCK:]
    # Another version than the origin's: 412, and none of the object's bytes.
    for index in (0, 1, 2):
        s, h, body = raw(a, q(index=index, etag='"0123456789abcdef0123456789abcdef"'), key)
        assert s == 412, (s, body[:300])
        assert "x-strata-blake3" not in {k.lower() for k in h}
        assert objects["open/data.bin"][index * BLOCK:index * BLOCK + 64] not in body
    # A backend this agent does not have; another block size; a block past the end.
    assert raw(a, q(backend=f"s3://{name}/@http://127.0.0.1:1"), key)[0] == 404
    assert raw(a, q(backend="file:///etc"), key)[0] == 404
    assert raw(a, q(block_size=BLOCK * 2), key)[0] == 400
    assert raw(a, q(index=4), key)[0] == 400

    # Team-owned prefixes: the read is decided for the principal it is for.
    for t in ("vision", "nlp"):
        cli(a, "team", "create", t)
    cli(a, "prefix", "own", "default", "vision", "vision")
    pid = {t: json.loads(cli(a, "token", "create", "--name", f"{t}-reader", "--team", t, "--role", "reader",
                             "--json")) for t in ("vision", "nlp")}
    pid = {t: v["principal"]["id"] for t, v in pid.items()}
    assert all(isinstance(v, str) and v.startswith("p_") for v in pid.values()), pid
    secret = objects["vision/secret.bin"]
    # An agent sharing this agent's catalog (it says so with the catalog's identity) asks for its principals.
    same = {**key, "x-strata-catalog": json.loads(api_get(f"{a.api}/v1/cluster").read())["catalog"]}
    s, _, body = raw(a, q(key="vision/secret.bin", index=0), {**same, "x-strata-principal": pid["nlp"]})
    assert s == 403 and secret[:64] not in body, (s, body[:300])
    s, _, body = raw(a, q(key="vision/secret.bin", index=0), {**same, "x-strata-principal": "p_no_such_principal"})
    assert s == 403 and secret[:64] not in body, (s, body[:300])
    s, _, body = raw(a, q(key="vision/secret.bin", index=0), {**same, "x-strata-principal": pid["vision"]})
    assert s == 200 and body == secret[:BLOCK], (s, body[:300])
    # The other team's principal may still read what no team owns.
    s, _, body = raw(a, q(index=0), {**same, "x-strata-principal": pid["nlp"]})
    assert s == 200 and body == objects["open/data.bin"][:BLOCK]
    # An agent with a catalog of its own: its principals mean nothing here, its access decision stands.
    other = {**key, "x-strata-catalog": "c_another_catalog"}
    s, _, body = raw(a, q(key="vision/secret.bin", index=0), {**other, "x-strata-principal": pid["nlp"]})
    assert s == 200 and body == secret[:BLOCK], (s, body[:300])

    # The metadata route, by the same rules: only the cluster key, only a key the principal may read.
    def mq(key="open/data.bin", backend=backend_id):
        return "/v1/peer/meta?" + urllib.parse.urlencode({"backend": backend, "key": key})
    assert raw(a, mq())[0] == 401
    assert raw(a, mq(), {"Authorization": f"Bearer {ADMIN_TOKEN}"})[0] == 403
    assert raw(a, mq(), {"x-strata-cluster-key": SECRET[:-1]})[0] == 401
    s, _, body = raw(a, mq(), key)
    m = json.loads(body)
    assert s == 200 and m["object"]["key"] == "open/data.bin", (s, body[:300])
    assert m["object"]["size"] == len(objects["open/data.bin"]) and m["object"]["etag"] == head["ETag"], m
    assert 0 <= m["age_ms"] < 60_000, m
    # No such object: an answer (not an error), so the asker does not HEAD it again.
    s, _, body = raw(a, mq(key="open/missing.bin"), key)
    assert s == 200 and json.loads(body)["object"] is None, (s, body[:300])
    assert raw(a, mq(backend=f"s3://{name}/@http://127.0.0.1:1"), key)[0] == 404
    assert raw(a, mq(key="bad\x00key"), key)[0] == 400
    s, _, body = raw(a, mq(key="vision/secret.bin"), {**same, "x-strata-principal": pid["nlp"]})
    assert s == 403 and b'"size"' not in body, (s, body[:300])
    s, _, body = raw(a, mq(key="vision/secret.bin"), {**same, "x-strata-principal": pid["vision"]})
    assert s == 200 and json.loads(body)["object"]["size"] == len(secret), (s, body[:300])


# ---------------------------------------------------------------------------------------------------------------
# 5. Membership from the shared PostgreSQL catalog


def _need(what):
    if os.environ.get("STRATA_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{what} (STRATA_REQUIRE_POSTGRES=1)")
    pytest.skip(what)


@pytest.fixture()
def pg_databases():
    """make() -> the URL of a fresh PostgreSQL database on the server of STRATA_TEST_POSTGRES_URL
    (scripts/test.sh); all of them are dropped after the test."""
    admin = os.environ.get("STRATA_TEST_POSTGRES_URL")
    if not admin:
        _need("no STRATA_TEST_POSTGRES_URL")
    psql = shutil.which("psql")
    if not psql:
        _need("no psql to create a database with")
    made = []

    def run(sql):
        r = subprocess.run([psql, admin, "-v", "ON_ERROR_STOP=1", "-Atc", sql], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr

    def make():
        db = f"strata_shared_{uuid.uuid4().hex[:12]}"
        run(f'CREATE DATABASE "{db}"')
        made.append(db)
        u = urllib.parse.urlsplit(admin)
        return urllib.parse.urlunsplit((u.scheme, u.netloc, f"/{db}", u.query, u.fragment))

    try:
        yield make
    finally:
        for db in made:
            run(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


@pytest.fixture()
def pg_url(pg_databases):
    return pg_databases()


CATALOG_CLUSTER = 'cache = "catalog"\nheartbeat_secs = 1\nmember_ttl_secs = 3'
CAPS = {"agent0": 96 * MIB, "agent1": 160 * MIB, "agent2": 128 * MIB}


def catalog_agent(c, endpoint, bucket, url, **kw):
    name = f"agent{len(c.agents)}"
    return c.add(endpoint, bucket, CATALOG_CLUSTER, extra=f'[catalog]\nurl = "{url}"',
                 disk=f"{CAPS[name] // MIB}MiB", env={"STRATA_CATALOG_KEY": CATALOG_KEY}, **kw)


def view_of(agent):
    s = agent.cluster()
    return {m["id"]: m for m in s["members"]}


def sees(agents, members):
    """Every agent of `agents` sees exactly `members`, weighted by their cache capacity."""
    want = {m.api: float(CAPS[m.name]) for m in members}
    return all({i: m["weight"] for i, m in view_of(a).items()} == want for a in agents)


def catalog_pair(origin, bucket, cluster, url):
    """Two catalog agents that see each other, and a dataset read through both (each block from the origin
    once). Returns (proxy, objects, agents)."""
    name, s3 = bucket
    objects = make_objects(60, 6, lo=1 * MIB, hi=2 * MIB, prefix="cat/")
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    a1 = catalog_agent(cluster, proxy.url, name, url).start()
    a2 = catalog_agent(cluster, proxy.url, name, url).start()
    poll("two catalog agents see each other", lambda: sees([a1, a2], [a1, a2]), timeout=15)
    for a in (a1, a2):
        s = a.cluster()
        assert s["membership"] == "catalog" and s["me"] == a.api, s
        share = {m["id"]: m["share"] for m in s["members"]}
        # Weighted rendezvous: shares follow capacities (96 : 160).
        assert abs(share[a2.api] - 160 / 256) < 0.05, share
    failed, bad = check_bodies(read_all([(a, k, None) for k in objects for a in (a1, a2)]), objects)
    assert not failed and not bad, (failed[:3], bad[:3], cluster.logs())
    assert_each_byte_fetched_once(proxy, name, objects)
    assert a1.cluster()["cache"]["peer_blocks"] > 0 and a2.cluster()["cache"]["peer_blocks"] > 0
    return proxy, objects, [a1, a2]


def snapshot(agents):
    out = {}
    for a in agents:
        s = a.cluster()
        out[a.name] = {**{k: s["cache"][k] for k in ("origin_bytes", "peer_bytes", "peer_blocks",
                                                    "served_to_peers", "served_to_peers_bytes")},
                       "asked": s["asked"], "moved": s["moved"]}
    return out


def test_a_jobs_bytes_by_tier_add_up_across_two_agents_to_what_the_origin_sent(origin, bucket, cluster, pg_url):
    name, s3 = bucket
    objects = make_objects(11, 6)
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    # The two agents share a catalog (PostgreSQL), where each puts its rollups every second: the fleet view.
    agents = static_cluster(cluster, 2, proxy.url, name, env={"STRATA_CATALOG_KEY": CATALOG_KEY},
                            extra=f'[catalog]\nurl = "{pg_url}"\n[analytics]\nflush_secs = 1')
    for a in agents:
        poll("metadata trusted", lambda: a.cluster()["coherence"]["trusted"], 30)
    # One loader job reads every object through both agents (a rank on each node).
    tasks = [(a, k, None) for k in objects for a in agents]
    results = read_all(tasks, via=lambda ag: (lambda k, rng: ag.read(k, rng, job="loader-7")))
    failed, bad = check_bodies(results, objects)
    assert not failed and not bad, (failed[:3], bad[:3])
    sent = sum(b - a for spans in object_gets(proxy, name).values() for a, b in spans)
    assert sent == sum(len(v) for v in objects.values()), "each byte from the origin once"

    def tiers(a):
        req = urllib.request.Request(f"{a.api}/v1/analytics/jobs/vision/loader-7",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        p = json.load(urllib.request.urlopen(req, timeout=10))
        return {t: sum(s["tiers"][t] for s in p["timeline"]) for t in ("ram", "disk", "peer", "origin")}
    # The job's origin bytes, added up over the agents, are what the origin sent (fills for a peer's ask are
    # the asking job's); each agent got the other's blocks from it.
    per = poll("both agents' analytics to hold the job's reads",
               lambda: (lambda v: v if sum(t["origin"] for t in v) == sent else None)([tiers(a) for a in agents]),
               timeout=30)
    assert all(t["peer"] > 0 for t in per), per

    # The fleet view, asked of either agent, is both agents' rollups added up: the same bytes by tier, the
    # origin's exactly what it sent, and every read the job made through either agent.
    def fleet(a):
        req = urllib.request.Request(f"{a.api}/v1/analytics/fleet?by=job&minutes=10",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        return {(x["team"], x["name"]): x for x in json.load(urllib.request.urlopen(req, timeout=10))}
    want = {t: sum(p[t] for p in per) for t in ("ram", "disk", "peer", "origin")}
    line = poll("the fleet view to add both agents up", lambda: (lambda f: f if f.get(("vision", "loader-7"), {}).get(
        "tiers") == want else None)(fleet(agents[0])), timeout=30)[("vision", "loader-7")]
    assert len(line["agents"]) == 2, line
    assert line["tiers"]["origin"] == sent, (line, sent)
    assert line["ops"]["data_read"] == len(tasks), line
    assert line["bytes"]["data_read"] == 2 * sum(len(v) for v in objects.values()), line
    assert fleet(agents[1])[("vision", "loader-7")]["tiers"] == want


def test_catalog_members_join_and_leave_without_moving_bytes(origin, bucket, cluster, pg_url):
    proxy, objects, (a1, a2) = catalog_pair(origin, bucket, cluster, pg_url)
    before = snapshot([a1, a2])
    changes = {a.name: a.cluster()["view_changes"] for a in (a1, a2)}
    proxy.clear()

    # A third agent joins: everyone sees three members within a few heartbeats.
    a3 = catalog_agent(cluster, proxy.url, bucket[0], pg_url).start()
    poll("all three see three members", lambda: sees([a1, a2, a3], [a1, a2, a3]), timeout=15)
    for a in (a1, a2):
        s = a.cluster()
        assert s["view_changes"] > changes[a.name], s
        assert s["previous_view"] and s["previous_view"]["members"] == 2, s
    # Nothing is read, so nothing moves: no block pushed, pulled or re-read because of the join, for a while.
    time.sleep(3)
    assert snapshot([a1, a2]) == before
    s3_ = snapshot([a3])["agent2"]
    assert all(v == 0 for v in s3_.values()), s3_
    assert object_gets(proxy, bucket[0]) == {}

    # It stops (SIGTERM): it leaves the catalog, the others see two members again, and still nothing moves.
    # Left, not expired: its row is gone (an expired member's row stays until some agent leaves), so no clock
    # decides this on a loaded machine.
    a3.term()
    assert a3.proc.returncode == 0, a3.log()
    poll("the others see it leave", lambda: sees([a1, a2], [a1, a2]), timeout=10, every=0.1)
    rows = subprocess.run([shutil.which("psql"), pg_url, "-Atc", "SELECT id FROM cluster_members ORDER BY id"],
                          capture_output=True, text=True, timeout=60)
    assert rows.returncode == 0, rows.stderr
    assert len(rows.stdout.split()) == 2, ("the stopped agent's row is still there: it did not leave", rows.stdout)
    assert snapshot([a1, a2]) == before
    assert object_gets(proxy, bucket[0]) == {}
    # The dataset is still whole through both.
    failed, bad = check_bodies(read_all([(a, k, None) for k in objects for a in (a1, a2)]), objects)
    assert not failed and not bad
    assert object_gets(proxy, bucket[0]) == {}


def test_a_joining_agent_reads_no_block_from_the_origin_that_a_member_holds(origin, bucket, cluster, pg_url):
    proxy, objects, (a1, a2) = catalog_pair(origin, bucket, cluster, pg_url)
    a3 = catalog_agent(cluster, proxy.url, bucket[0], pg_url).start()
    poll("all three see three members", lambda: sees([a1, a2, a3], [a1, a2, a3]), timeout=15)
    proxy.clear()
    # Every block is held by both a1 and a2; the joiner owns about a third of them now.
    failed, bad = check_bodies(read_all([(a3, k, None) for k in objects]), objects)
    assert not failed and not bad
    s = a3.cluster()
    assert s["cache"]["peer_bytes"] == sum(len(v) for v in objects.values()), s
    assert object_gets(proxy, bucket[0]) == {}, "blocks re-read from the origin after a join"


# ---------------------------------------------------------------------------------------------------------------
# 6. Membership from a Slurm node list


def port_free_on(hosts):
    for _ in range(50):
        p = free_port()
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, p))
            return p
        except OSError:
            continue
    raise RuntimeError("no port free on every host")


def test_slurm_node_list_members_share_one_copy(origin, bucket, cluster):
    name, s3 = bucket
    hosts = ["127.0.0.1", "127.0.0.2"]
    try:
        port = port_free_on(hosts)
    except RuntimeError:
        pytest.skip("cannot bind a port on both 127.0.0.1 and 127.0.0.2")
    objects = make_objects(70, 6, lo=1 * MIB, hi=2 * MIB, prefix="slurm/")
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    env = {"SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_JOB_ID": "4242"}
    agents = [cluster.add(proxy.url, name, f'cache = "slurm"\nslurm_port = {port}\nadvertise = "{h}:{port}"',
                          api_host=h, api_port=port, env=env) for h in hosts]
    for a in agents:
        a.start()
    want = {f"http://{h}:{port}" for h in hosts}
    for a in agents:
        s = a.cluster()
        assert s["membership"] == "slurm" and s["me"] == a.api, s
        assert {m["id"] for m in s["members"]} == want, s["members"]
        assert all(m["weight"] == 1.0 and m["state"] == "up" for m in s["members"]), s["members"]
    failed, bad = check_bodies(read_all([(a, k, None) for k in objects for a in agents]), objects)
    assert not failed and not bad, (failed[:3], bad[:3], cluster.logs())
    assert_each_byte_fetched_once(proxy, name, objects)
    cache = [a.cluster()["cache"] for a in agents]
    assert all(c["peer_blocks"] > 0 and c["served_to_peers"] > 0 for c in cache), cache
    assert sum(c["origin_bytes"] for c in cache) == sum(len(v) for v in objects.values()), cache


def endpoint_slice(name, service, port, addresses, ready=True):
    """An EndpointSlice as the endpoints controller writes one for a Service's pods."""
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "api", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a in addresses]}


def test_kubernetes_members_are_the_ready_endpoints_of_the_agents_service(origin, bucket, cluster, tmp_path):
    # `cache = "kubernetes"`: the members are the ready endpoints of the headless Service's EndpointSlices
    # (watched on a fake API server: kmock, see kube_api.py). Two agents on loopback, one slice each (a real
    # cluster has one port and many pod IPs; here the port tells them apart).
    from kube_api import FakeKubeApi, endpointslices

    name, s3 = bucket
    objects = make_objects(71, 6, lo=1 * MIB, hi=2 * MIB, prefix="k8s/")
    upload(s3, name, objects)
    kube = FakeKubeApi(str(tmp_path / "kube-api.log"))
    try:
        api = kube.client
        ns = "strata-system"
        ports = [free_port(), free_port()]
        api.create(endpointslices(ns), endpoint_slice("strata-agents-a", "strata-agents", ports[0], ["127.0.0.1"]))
        api.create(endpointslices(ns), endpoint_slice("strata-agents-b", "strata-agents", ports[1], ["127.0.0.1"]))
        # Another Service's endpoints (same namespace) are no members.
        api.create(endpointslices(ns), endpoint_slice("other-x", "other", 7070, ["10.9.9.9"]))
        env = {"KUBECONFIG": kube.kubeconfig(str(tmp_path / "kubeconfig"))}
        proxy = cluster.proxy(origin.removeprefix("http://"))
        agents = [cluster.add(proxy.url, name, f'cache = "kubernetes"\nkube_namespace = "{ns}"\n'
                              f'advertise = "127.0.0.1:{p}"', api_port=p, env=env) for p in ports]
        for a in agents:
            a.start()
        both = {a.me for a in agents}

        def members(a):
            return {m["id"] for m in a.cluster()["members"]}

        for a in agents:
            s = a.cluster()
            assert s["membership"] == "kubernetes" and s["me"] == a.me, s
            assert members(a) == both, (s["members"], a.log())
        failed, bad = check_bodies(read_all([(a, k, None) for k in objects for a in agents]), objects)
        assert not failed and not bad, (failed[:3], bad[:3], cluster.logs())
        assert_each_byte_fetched_once(proxy, name, objects)
        # B's pod turns unready (failing its readiness probe, or terminating): A's view drops it.
        a, b = agents
        api.merge_patch(endpointslices(ns, "strata-agents-b"),
                        {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": False}}]})
        poll("the unready agent leaving A's view", lambda: members(a) == {a.me}, 15)
        # Its slice replaced by a new one naming it ready again (a restarted pod): back in.
        api.delete(endpointslices(ns, "strata-agents-b"))
        api.create(endpointslices(ns), endpoint_slice("strata-agents-c", "strata-agents", ports[1], ["127.0.0.1"]))
        poll("the agent back in both views", lambda: members(a) == both and members(b) == both, 15)
    finally:
        kube.stop()


# ---------------------------------------------------------------------------------------------------------------
# 7. The loader on two nodes, each through its own agent


LOADER = r"""
import json, sys
import strata
url, agent = sys.argv[1:3]
ds = strata.StreamingDataset(url, shuffle=True, seed=9, agent=agent, cache="agent", rank=0, world_size=1)
assert ds.source_kind == "agent", ds.source_kind
print(json.dumps([[s["__key__"], s["bin"].hex()[:16]] for s in ds]))
"""


def test_loaders_on_two_nodes_read_each_block_from_the_origin_once(origin, bucket, cluster, s3_env, tmp_path):
    strata = pytest.importorskip("strata")
    wds = pytest.importorskip("webdataset")
    name, s3 = bucket
    d = str(tmp_path / "wds")
    os.makedirs(d)
    rng = random.Random(80)
    with wds.ShardWriter(os.path.join(d, "shard-%05d.tar"), maxcount=40, verbose=0) as sink:
        for i in range(200):
            sink.write({"__key__": f"sample{i:05d}", "bin": rng.randbytes(rng.randint(1000, 40000)),
                        "cls": str(i % 7).encode()})
    shards = {}
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as fh:
            shards[f"ds/{f}"] = fh.read()
    upload(s3, name, shards)
    # Indexed where it lives (in process, straight from the origin): the manifest records the ETags.
    assert strata.index_dataset(f"s3://{name}/ds") == 200
    want = [[s["__key__"], s["bin"][:8].hex()] for s in strata.StreamingDataset(d, shuffle=True, seed=9)]
    proxy = cluster.proxy(origin.removeprefix("http://"))
    agents = static_cluster(cluster, 2, proxy.url, name)
    procs = [subprocess.Popen([sys.executable, "-c", LOADER, f"s3://{name}/ds", a.api], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in agents]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out))
    # Both nodes get the samples in the order the loader gives without any agent.
    assert outs[0] == want and outs[1] == want
    # Each shard byte came from the origin once for the two nodes.
    gets = {k: v for k, v in object_gets(proxy, name).items() if k.endswith(".tar")}
    assert sorted(gets) == sorted(shards)
    assert_each_byte_fetched_once_in(gets, shards)
    cache = [a.cluster()["cache"] for a in agents]
    assert all(c["peer_blocks"] > 0 for c in cache), cache


def test_catalog_agents_started_at_once_on_a_fresh_catalog_all_start(bucket, cluster, pg_databases):
    for trial in range(3):
        url = pg_databases()
        c = Cluster()
        try:
            agents = [catalog_agent(c, "http://127.0.0.1:9", bucket[0], url) for _ in range(3)]
            for a in agents:
                a.start(wait=False)
            failed = []
            for a in agents:
                try:
                    a.wait_ready()
                except RuntimeError as e:
                    failed.append(str(e)[-400:])
            assert not failed, f"trial {trial}: {failed}"
            poll("three members", lambda: sees(agents, agents), timeout=15)
        finally:
            c.close()


# ---------------------------------------------------------------------------------------------------------------
# 8. A claim staged over the cluster: each member stages the blocks it owns


def post_json(agent, path, body, token=ADMIN_TOKEN, headers=None):
    req = urllib.request.Request(f"{agent.api}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw


def submit_claim(agent, job, location, **dataset):
    post_json(agent, "/v1/teams", {"name": "vision"})
    s, c = post_json(agent, "/v1/claims", {"version": 1, "job": job, "team": "vision",
                                           "datasets": [{"name": "train", "location": location, **dataset}]})
    assert s == 200, c
    return c["id"]


def settled(agent, cid, timeout=120):
    return poll(f"claim {cid} settled", lambda: (lambda c: c if c["state"] in ("ready", "failed") else None)(
        agent.get_json(f"/v1/claims/{cid}")), timeout=timeout)


def blocks_of(objects):
    return sum(-(-len(v) // BLOCK) for v in objects.values())


def test_a_claim_is_staged_by_each_member_for_the_blocks_it_owns(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(80, 24, lo=1 * MIB, hi=2 * MIB, prefix="stage/", keys=[
        f"{i:02d}-{n}" for i, n in enumerate(["plain.bin", "with space.bin", "plus+sign.bin", "per%cent.bin",
                                              "ünï/日本.bin", "deep/er/x.bin"] * 4)])
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    a, b, c = static_cluster(cluster, 3, proxy.url, name)
    poll("three members", lambda: all(len(x.cluster()["members"]) == 3 for x in (a, b, c)), timeout=15)

    cid = submit_claim(a, "job-spread", "default/stage/")
    got = settled(a, cid)
    p = got["progress"]
    assert got["state"] == "ready", (got, cluster.logs())
    size = sum(len(v) for v in objects.values())
    assert p["blocks_total"] == p["blocks_held"] == blocks_of(objects), p
    assert p["bytes_total"] == p["bytes_done"] == size and p["objects_done"] == p["objects_total"] == 24, p
    # Each block was read from the origin once, by its owner: every member read its share, and no block went
    # from a member to the agent that took the claim.
    gets = object_gets(proxy, name)
    assert_each_byte_fetched_once_in(gets, objects)
    cache = {x.name: x.cluster()["cache"] for x in (a, b, c)}
    assert all(cc["origin_bytes"] > 0 for cc in cache.values()), cache
    assert sum(cc["origin_bytes"] for cc in cache.values()) == size, cache
    assert all(cc["peer_blocks"] == 0 and cc["served_to_peers"] == 0 for cc in cache.values()), (cache, cluster.logs())
    assert cache[a.name]["origin_bytes"] < size * 0.6, cache
    # The job then reads every byte, on every node, without the origin.
    for x in (a, b, c):
        failed, bad = check_bodies(read_all([(x, k, None) for k in objects], workers=8), objects)
        assert not failed and not bad, (failed[:2], bad[:2])
    assert object_gets(proxy, name) == gets


def test_a_claim_with_two_replicas_keeps_two_copies_and_a_dead_node_takes_no_block_with_it(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(82, 12, lo=1 * MIB, hi=3 * MIB, prefix="stage-rep/")
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    a, b, c = static_cluster(cluster, 3, proxy.url, name)
    poll("three members", lambda: all(len(x.cluster()["members"]) == 3 for x in (a, b, c)), timeout=15)
    cid = submit_claim(a, "job-replicas", "default/stage-rep/", replicas=2)
    got = settled(a, cid)
    p = got["progress"]
    assert got["state"] == "ready", (got.get("reason"), got["progress"], cluster.logs())
    # Counted per copy: every block twice, on two members.
    assert p["blocks_total"] == p["blocks_held"] == 2 * blocks_of(objects), p
    assert p["bytes_total"] == p["bytes_done"] == 2 * sum(len(v) for v in objects.values()), p
    # Still one origin read per block: a second owner takes its copy from the first.
    gets = object_gets(proxy, name)
    assert_each_byte_fetched_once_in(gets, objects)
    cache = {x.name: x.cluster()["cache"] for x in (a, b, c)}
    assert sum(cc["peer_blocks"] for cc in cache.values()) == blocks_of(objects), cache
    # More copies than members: one per member, three here.
    more = make_objects(83, 4, lo=1 * MIB, hi=2 * MIB, prefix="stage-rep5/")
    upload(s3, name, more)
    cid = submit_claim(a, "job-replicas-5", "default/stage-rep5/", replicas=5)
    got = settled(a, cid)
    assert got["state"] == "ready", (got.get("reason"), got["progress"], cluster.logs())
    assert got["progress"]["blocks_total"] == got["progress"]["blocks_held"] == 3 * blocks_of(more), got
    gets = object_gets(proxy, name)
    assert_each_byte_fetched_once_in({k: v for k, v in gets.items() if k in more}, more)
    # A node goes: every block has copies left, so the job reads every byte without the origin.
    b.kill()
    for x in (a, c):
        failed, bad = check_bodies(read_all([(x, k, None) for k in objects], workers=8), objects)
        assert not failed and not bad, (failed[:2], bad[:2])
    assert object_gets(proxy, name) == gets, "a block was read from the origin again"


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_member_dead_during_staging_leaves_its_share_to_the_agent_that_took_the_claim(origin, bucket, cluster,
                                                                                       replicas):
    name, s3 = bucket
    objects = make_objects(81, 16, lo=1 * MIB, hi=2 * MIB, prefix="stage-kill/")
    upload(s3, name, objects)
    # A slow origin (every member reads through the same one: a backend's id names its endpoint): the
    # members' first reads still wait when B is killed.
    proxy = cluster.proxy(origin.removeprefix("http://"),
                          before=lambda m, path: time.sleep(3) if m == "GET" and "stage-kill" in path else None)
    a, b, c = static_cluster(cluster, 3, proxy.url, name)
    poll("three members", lambda: all(len(x.cluster()["members"]) == 3 for x in (a, b, c)), timeout=15)
    cid = submit_claim(a, "job-kill", "default/stage-kill/", replicas=replicas)
    time.sleep(1)  # B's first origin reads are still in their wait
    assert a.get_json(f"/v1/claims/{cid}")["state"] == "staging"
    b.kill()
    got = settled(a, cid, timeout=180)
    p = got["progress"]
    assert got["state"] == "ready", (got, cluster.logs())
    assert p["blocks_total"] == p["blocks_held"] == blocks_of(objects), p
    assert "a member did not stage its share" in a.log(), a.log()
    # Ready, with one copy of each block: a claim that asked for more says so in its status.
    if replicas == 1:
        assert got["reason"] == "", got
    else:
        assert got["reason"] == "train: one copy of each block kept, not 2 (a member did not stage its share)", got
    # The job reads every byte through the members left, none of them damaged.
    for x in (a, c):
        failed, bad = check_bodies(read_all([(x, k, None) for k in objects], workers=8), objects)
        assert not failed and not bad, (failed[:2], bad[:2])


def coverage(agent, location, token=ADMIN_TOKEN):
    """`GET /v1/coverage` of `location` as `token`: (status, body)."""
    req = urllib.request.Request(f"{agent.api}/v1/coverage?location={urllib.parse.quote(location, safe='')}",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_coverage_counts_each_members_share_fetches_nothing_and_names_a_dead_member(origin, bucket, cluster):
    # What a Dataset's status shows (`GET /v1/coverage`): the listing's version, and the blocks held counted
    # where they live, each member its own share (`POST /v1/peer/held`), nothing read from the origin.
    name, s3 = bucket
    objects = make_objects(83, 12, lo=1 * MIB, hi=2 * MIB, prefix="cov/", keys=[
        f"{i:02d}-{n}" for i, n in enumerate(["a b.bin", "c+d.bin", "e%f.bin", "ünï/日本.bin"] * 3)])
    upload(s3, name, objects)
    size = sum(len(v) for v in objects.values())
    proxy = cluster.proxy(origin.removeprefix("http://"))
    a, b, c = static_cluster(cluster, 3, proxy.url, name)
    poll("three members", lambda: all(len(x.cluster()["members"]) == 3 for x in (a, b, c)), timeout=15)

    s, cold = coverage(a, "default/cov/")
    assert s == 200, cold
    assert len(cold["version"]) == 16 and cold["complete"], cold
    assert (cold["objects"], cold["bytes_total"], cold["blocks_total"]) == (12, size, blocks_of(objects)), cold
    assert cold["bytes_held"] == cold["blocks_held"] == cold["objects_held"] == 0, cold
    assert {m["member"] for m in cold["members"]} == {a.me, b.me, c.me}, cold
    assert cold["members"][0]["member"] == a.me
    assert sum(m["bytes_total"] for m in cold["members"]) == size, cold
    assert object_gets(proxy, name) == {}, "coverage read object data from the origin"

    cid = submit_claim(a, "job-coverage", "default/cov/")
    assert settled(a, cid)["state"] == "ready"
    # Asked of another member, after the claim staged the version over the cluster: all of it, each share held.
    s, warm = coverage(b, "default/cov/")
    assert s == 200 and warm["complete"], warm
    assert warm["version"] == cold["version"], (warm, cold)
    assert (warm["bytes_held"], warm["blocks_held"], warm["objects_held"]) == (size, blocks_of(objects), 12), warm
    assert all(m["bytes_held"] == m["bytes_total"] > 0 for m in warm["members"]), warm
    # The CLI says the same.
    out = cli(b, "cache", "coverage", "default/cov/")
    assert f"default/cov/ version {cold['version']}: 100% cached, 12/12 objects, {size}/{size} bytes" in out, out
    assert all(f"  {x.me}: " in out for x in (a, b, c)), out
    gets = object_gets(proxy, name)

    # A changed object is another version, and its new bytes are not held.
    changed = dict(objects)
    changed["cov/00-a b.bin"] = os.urandom(MIB + 5)
    upload(s3, name, {"cov/00-a b.bin": changed["cov/00-a b.bin"]})
    poll("the listing cache to see the change",
         lambda: coverage(a, "default/cov/")[1]["version"] != cold["version"], timeout=30)
    s, after = coverage(a, "default/cov/")
    assert after["bytes_total"] == sum(len(v) for v in changed.values()), after
    assert after["bytes_held"] == size - len(objects["cov/00-a b.bin"]) and after["objects_held"] == 11, after

    # A member gone: named with its error, its share counted as not held, the rest still counted.
    c.kill()
    s, partial = coverage(a, "default/cov/")
    assert s == 200 and not partial["complete"], partial
    dead = [m for m in partial["members"] if m["member"] == c.me]
    assert dead and dead[0].get("error") and dead[0]["bytes_held"] == 0, partial
    alive = [m for m in after["members"] if m["member"] != c.me]
    assert partial["bytes_held"] == sum(m["bytes_held"] for m in alive), (partial, after)
    out = cli(a, "cache", "coverage", "default/cov/")
    assert "(not every agent answered)" in out and f"  {c.me}: not counted: " in out, out
    assert object_gets(proxy, name) == gets, "coverage read object data from the origin"

    # No token, or a forged one: refused. The peer route takes only the cluster credential.
    assert coverage(a, "default/cov/", token=None)[0] == 401
    assert coverage(a, "default/cov/", token="stk_forged")[0] == 401
    job = {"backend": "x", "block_size": BLOCK, "objects": []}
    for token, headers in [(None, {}), (ADMIN_TOKEN, {}), (None, {"x-strata-cluster-key": "forged"})]:
        s, v = post_json(b, "/v1/peer/held", job, token=token, headers=headers)
        assert s in (401, 403), (token, headers, s, v)


def test_the_stage_route_takes_only_the_cluster_credential(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(82, 2, prefix="stage-auth/")
    upload(s3, name, objects)
    a, b = static_cluster(cluster, 2, origin, name)
    job = {"backend": "x", "block_size": BLOCK, "objects": []}
    # No credential, a token (even the administrator's), a forged cluster key: refused, nothing staged.
    for token, headers in [(None, {}), (ADMIN_TOKEN, {}), (None, {"x-strata-cluster-key": "forged"})]:
        s, v = post_json(b, "/v1/peer/stage", job, token=token, headers=headers)
        assert s in (401, 403), (token, headers, s, v)
    assert b.cluster()["cache"]["origin_bytes"] == 0


# ---------------------------------------------------------------------------------------------------------------
# 9. A claim's mounts on every node of a multi-node job (agents sharing a PostgreSQL catalog, each in a mount
#    namespace of its own: two nodes, one mount path)


def _fuse_or_skip():
    if not (os.path.exists("/dev/fuse") and shutil.which("fusermount3") and shutil.which("unshare")
            and shutil.which("nsenter") and os.geteuid() == 0):
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            pytest.fail("STRATA_REQUIRE_FUSE=1 but /dev/fuse, fusermount3, unshare, nsenter or root is missing")
        pytest.skip("claim mounts need /dev/fuse and root")


def on_node(agent, *cmd):
    """`cmd` in `agent`'s mount namespace (its node)."""
    return subprocess.run(["nsenter", "--target", str(agent.proc.pid), "--mount", "--", *cmd], capture_output=True,
                          timeout=60)


def mounted_on(agent, path):
    info = on_node(agent, "cat", "/proc/self/mountinfo").stdout.decode()
    return any(line.split(" ")[4] == path for line in info.splitlines())


def test_a_claim_is_mounted_on_every_node_that_attaches_and_unmounted_everywhere_at_release(
        origin, bucket, cluster, pg_databases):
    _fuse_or_skip()
    if subprocess.run(["getent", "group", "vision"], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", "vision"], check=True)
    name, s3 = bucket
    objects = make_objects(90, 6, lo=100_000, hi=2 * MIB, prefix="attach/", keys=UGLY)
    upload(s3, name, objects)
    proxy = cluster.proxy(origin.removeprefix("http://"))
    url = pg_databases()
    node = ["unshare", "--mount", "--propagation", "private", "--"]
    a, b = [catalog_agent(cluster, proxy.url, name, url, wrap=node) for _ in range(2)]
    for x in (a, b):
        x.start(wait=False)
    for x in (a, b):
        x.wait_ready()
    poll("two members", lambda: sees([a, b], [a, b]), timeout=15)
    where = tempfile.mkdtemp(prefix="strata-attach-", dir="/tmp")
    path = os.path.join(where, "train")
    try:
        post_json(a, "/v1/teams", {"name": "vision"})
        s, c = post_json(a, "/v1/claims", {"version": 1, "job": "job-nodes", "team": "vision",
                                           "datasets": [{"name": "train", "location": "default/attach/",
                                                         "mount": path}]})
        assert s == 200, c
        cid = c["id"]
        got = settled(a, cid)
        assert got["state"] == "ready", (got, cluster.logs())
        assert mounted_on(a, path) and not mounted_on(b, path)
        gets = object_gets(proxy, name)
        # No token, a forged one: refused.
        for token in (None, "forged-token"):
            s, v = post_json(b, f"/v1/claims/{cid}/attach", {}, token=token)
            assert s == 401, (s, v)
        assert not mounted_on(b, path)
        # The other node attaches: mounted there too, same path, the same bytes, from the cluster's cache.
        s, v = post_json(b, f"/v1/claims/{cid}/attach", {})
        assert s == 200, (s, v, b.log())
        assert mounted_on(b, path)
        s, v = post_json(b, f"/v1/claims/{cid}/attach", {})
        assert s == 200, (s, v)  # again: nothing changes
        for x in (a, b):
            for k, body in objects.items():
                r = on_node(x, "cat", os.path.join(path, k.removeprefix("attach/")))
                assert r.returncode == 0 and r.stdout == body, (x.name, k, r.stderr)
        assert object_gets(proxy, name) == gets, "the mounts read the staged blocks, not the origin"
        # The node's own commands (a node prolog and epilog): detach, attach again.
        cli = lambda *a: subprocess.run([STRATA, "claim", *a, "--api", b.api], capture_output=True, text=True,
                                        timeout=120, env=dict(os.environ, STRATA_TOKEN=ADMIN_TOKEN))
        r = cli("detach", cid)
        assert r.returncode == 0 and "unmounted here" in r.stdout, r.stderr
        assert not mounted_on(b, path) and mounted_on(a, path)
        r = cli("attach", "--job", "job-nodes")
        assert r.returncode == 0 and f"train {path}" in r.stdout, (r.stdout, r.stderr)
        r = cli("attach", "--job", "no-such-job")
        assert r.returncode != 0 and "no live claim" in r.stderr, (r.stdout, r.stderr)
        assert mounted_on(b, path)
        # Released at the staging agent: unmounted there at once, and on the attached node within seconds.
        s, v = post_json(a, f"/v1/claims/{cid}/release", {"reason": "job done"})
        assert s == 200, v
        assert not mounted_on(a, path)
        poll("the attached node's mount to go", lambda: not mounted_on(b, path), timeout=20)
        poll("its state to go", lambda: not [n for n in os.listdir(os.path.join(b.data, "mounts"))
                                             if n.startswith(cid)], timeout=20)
        s, v = post_json(b, f"/v1/claims/{cid}/attach", {})
        assert s == 412 and "released" in v["message"], (s, v)
    finally:
        # Mount processes outlive their agent (by design): kill what a failure left, in both namespaces.
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if b"mount" in cmd and (a.data.encode() in cmd or b.data.encode() in cmd):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(where, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# A hung peer (issue 44, finding 8): it accepts connections (the kernel completes the handshake) and answers
# nothing. Reads must not wait for the peer timeout on it, nor writes for their announcement once its lease is
# over.


def test_a_hung_peer_stalls_no_read_for_its_timeout_and_no_write_past_its_lease(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(44, 24, lo=256 * KIB, hi=1536 * KIB, prefix="hung/")
    upload(s3, name, objects)
    timeout = 10.0  # the default peer_timeout_ms
    lease = 3.0
    agents = static_cluster(cluster, 3, origin, name,
                            extra_cluster=f"peer_timeout_ms = {int(timeout * 1000)}\n"
                                          f"metadata_lease_ms = {int(lease * 1000)}")
    live, hung = agents[:2], agents[2]
    hung.proc.send_signal(signal.SIGSTOP)
    # Suspicion backs off (1 s, 2 s, ...) and may have run out by the time the reads are done: watch it.
    watch = StateWatch(live, hung)
    try:
        lat = []
        lock = threading.Lock()

        def one(t):
            a, k = t
            start = time.time()
            body = a.read(k, timeout=120)
            with lock:
                lat.append((a.name, k, time.time() - start))
            return md5(body) == md5(objects[k])

        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            ok = list(ex.map(one, [(a, k) for k in objects for a in live]))
        assert all(ok)
        # Its blocks went to the origin instead; no read waited for the peer timeout.
        slow = [(n, k, round(t, 2)) for n, k, t in lat if t >= timeout]
        assert not slow, f"reads that waited for the hung peer's timeout ({timeout} s): {slow}"
        seen = watch.stop()
        for a in live:
            s = a.cluster()
            assert s["errors"] + s["meta_failed"] > 0 and s["suspected"] > 0, (a.name, s)
            assert "suspect" in seen[a.name], (a.name, seen)
        # Writes: once the hung member's lease is surely over (a lease after the last contact, plus margins),
        # none waits for its announcement.
        time.sleep(lease + 1)
        gw = client(f"http://127.0.0.1:{live[0].s3_port}", GW_KEY, GW_SECRET)
        before = live[0].cluster()["coherence"]
        for i in range(5):
            gw.put_object(Bucket="default", Key=f"hung/written-{i}", Body=b"w" * 1000)
        after = live[0].cluster()["coherence"]
        # Each write told the live member and skipped the hung one (its lease over): none waited for it.
        assert after["skipped"] - before.get("skipped", 0) == 5, (before, after)
        assert (after["unanswered"], after["waited_ms"]) == (before["unanswered"], before["waited_ms"]), \
            (before, after)
        assert live[1].read("hung/written-4") == b"w" * 1000
    finally:
        watch.stop()
        hung.proc.send_signal(signal.SIGCONT)


# ---------------------------------------------------------------------------------------------------------------
# Full caches (issue 44, finding 6): a standing cluster's caches are always full, and the default policy
# (TinyLFU) admits a new block only over a colder one. An owner that read a block for one member must still
# have it for the next: a new data set costs the origin each byte once, full caches or empty.


def test_full_caches_still_read_each_block_from_the_origin_once(origin, bucket, cluster):
    name, s3 = bucket
    old = make_objects(60, 60, lo=1 * MIB, hi=1 * MIB + 1, prefix="old/")
    new = make_objects(61, 24, lo=1 * MIB, hi=1 * MIB + 1, prefix="new/")
    upload(s3, name, {**old, **new})
    proxy = cluster.proxy(origin.removeprefix("http://"))
    # Each agent's RAM and disk tiers hold 16 + 16 MiB, under its 20 MiB share of the old set, whose blocks are
    # read three times through every agent: every tier is full of blocks TinyLFU counts as hot.
    agents = static_cluster(cluster, 3, proxy.url, name, ram="16MiB", disk="16MiB")
    for _ in range(3):
        failed, bad = check_bodies(read_all([(a, k, None) for k in old for a in agents], workers=6), old)
        assert not failed and not bad, (failed[:3], bad[:3])
    for a in agents:
        s = a.get_json("/v1/cache")
        assert s["disk"]["used_bytes"] >= 14 * MIB and s["ram"]["used_bytes"] >= 14 * MIB, (a.name, s)
    proxy.clear()
    # The new set, through every agent at once, each in its own order.
    tasks = []
    for i, a in enumerate(agents):
        tasks += [(a, k, None) for k in random.Random(i).sample(sorted(new), len(new))]
    failed, bad = check_bodies(read_all(tasks, workers=6), new)
    assert not failed and not bad, (failed[:3], bad[:3])
    gets = object_gets(proxy, name)
    egress = sum(sum(b - a for a, b in r) for r in gets.values())
    size = sum(len(v) for v in new.values())
    twice = {k: sorted(r) for k, r in gets.items() if sum(b - a for a, b in r) != len(new[k])}
    # Each byte once (before owned blocks were kept whatever the policy said, and peers' blocks off the disk
    # tier, this read 2.9x).
    assert egress == size, f"origin bytes {egress / size:.3f}x the set's; read more than once: {twice}"
    assert_each_byte_fetched_once(proxy, name, new)
