"""The shared cache across "hosts": four agents, each in its own network namespace with its own address on a
bridge, the origin (moto) on the bridge's address in the root namespace. A node is partitioned by taking its
link down (`ip link set ... down`): connections to it then hang (no ARP answer), which is what a dead switch
port or a hung node looks like, unlike the instant refusal of a killed process on loopback.

Needs root and `ip` (iproute2); skipped otherwise unless STRATA_REQUIRE_NETNS=1 (the test command sets it).
The addresses are 10.201.0.0/24 on a bridge this test creates and deletes; no traffic leaves the machine.
"""
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, VENV_BIN, client

NET = "10.201.0"
BRIDGE = "stratabr0"
N = 4
API_PORT, S3_PORT, MOTO_PORT = 7070, 9000, 9555
SECRET = "netns-cluster-secret-0123456789"
BLOCK = 256 * 1024


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def available():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    return sh("ip", "netns", "list", check=False).returncode == 0


if not available():
    if os.environ.get("STRATA_REQUIRE_NETNS") == "1":
        raise RuntimeError("STRATA_REQUIRE_NETNS=1 but network namespaces are not available (root and ip needed)")
    pytest.skip("network namespaces need root and iproute2", allow_module_level=True)


def ns(i):
    return f"strata-n{i}"


def addr(i):
    return f"{NET}.{i}"


def cleanup_net():
    for i in range(1, N + 1):
        sh("ip", "netns", "del", ns(i), check=False)
        sh("ip", "link", "del", f"sv{i}b", check=False)
    sh("ip", "link", "del", BRIDGE, check=False)
    # A deleted namespace's devices go away asynchronously: wait until the names are free again.
    deadline = time.time() + 10
    while any(sh("ip", "link", "show", name, check=False).returncode == 0
              for name in [BRIDGE] + [f"sv{i}b" for i in range(1, N + 1)]):
        assert time.time() < deadline, "the test's network devices did not go away"
        time.sleep(0.1)


def get(url, timeout=30, headers=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def wait_http(url, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            get(url, timeout=1)
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered at {url}")


class Net:
    """The bridge, four namespaces, moto on the bridge and one agent per namespace."""

    def __init__(self):
        cleanup_net()
        self.dir = tempfile.mkdtemp(prefix="strata-netns-")
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{NET}.254/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i in range(1, N + 1):
            sh("ip", "netns", "add", ns(i))
            sh("ip", "link", "add", f"sv{i}", "type", "veth", "peer", "name", f"sv{i}b")
            sh("ip", "link", "set", f"sv{i}", "netns", ns(i))
            sh("ip", "link", "set", f"sv{i}b", "master", BRIDGE)
            sh("ip", "link", "set", f"sv{i}b", "up")
            sh("ip", "netns", "exec", ns(i), "ip", "addr", "add", f"{addr(i)}/24", "dev", f"sv{i}")
            sh("ip", "netns", "exec", ns(i), "ip", "link", "set", f"sv{i}", "up")
            sh("ip", "netns", "exec", ns(i), "ip", "link", "set", "lo", "up")
        self.moto = subprocess.Popen(
            [os.path.join(VENV_BIN, "moto_server"), "-H", f"{NET}.254", "-p", str(MOTO_PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"http://{NET}.254:{MOTO_PORT}"
        deadline = time.time() + 30
        while True:
            try:
                self.s3 = client(self.endpoint, ORIGIN_KEY, ORIGIN_SECRET)
                self.s3.create_bucket(Bucket="netns")
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        self.agents = {}
        for i in range(1, N + 1):
            self.start(i)

    def config(self, i):
        path = os.path.join(self.dir, f"a{i}.toml")
        peers = ", ".join(f'"{addr(j)}:{API_PORT}"' for j in range(1, N + 1))
        with open(path, "w") as f:
            f.write(f"""
data_dir = "{self.dir}/d{i}"
[api]
listen = "{addr(i)}:{API_PORT}"
[gateway]
listen = "{addr(i)}:{S3_PORT}"
[cache]
block_size = "256KiB"
ram_capacity = "64MiB"
metadata_ttl_ms = 0
[retry]
max_retries = 2
initial_backoff = 10
max_backoff = 100
[[backends]]
name = "default"
url = "s3://netns"
[backends.options]
endpoint = "{self.endpoint}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
[cluster]
cache = "static"
peers = [{peers}]
peer_timeout_ms = 3000
""")
        return path

    def start(self, i):
        env = dict(os.environ, STRATA_CLUSTER_SECRET=SECRET, STRATA_LOG="warn")
        p = subprocess.Popen(["ip", "netns", "exec", ns(i), STRATA, "serve", "--config", self.config(i)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.agents[i] = p
        wait_http(self.api(i) + "/v1/cluster", p)

    def api(self, i):
        return f"http://{addr(i)}:{API_PORT}"

    def cluster(self, i):
        return json.loads(get(self.api(i) + "/v1/cluster"))

    def link(self, i, state):
        sh("ip", "netns", "exec", ns(i), "ip", "link", "set", f"sv{i}", state)

    def read(self, i, key, job=None):
        q = urllib.parse.quote(f"default/{key}", safe="")
        h = {"x-strata-job": job, "x-strata-dataset": key.split("/")[0]} if job else None
        return get(f"{self.api(i)}/v1/read?location={q}", timeout=60, headers=h)

    def job_io(self, i, job, dataset):
        for j in json.loads(get(self.api(i) + "/v1/cache"))["by_job"]:
            if j["job"] == job and j["dataset"] == dataset:
                return j
        return {"origin_bytes": 0, "peer_bytes": 0, "served_to_peers_bytes": 0}

    def close(self):
        for p in self.agents.values():
            p.kill()
            p.wait()
        self.moto.kill()
        self.moto.wait()
        cleanup_net()
        shutil.rmtree(self.dir, ignore_errors=True)


def running(make):
    """The harness `make()` builds, closed (and the network cleaned up) whatever happens: a fixture's body."""
    try:
        n = make()
    except BaseException:
        cleanup_net()
        raise
    try:
        yield n
    finally:
        n.close()


@pytest.fixture(scope="module")
def net():
    yield from running(Net)


def dataset(net, prefix, count=8, seed=0):
    objs = {}
    for k in range(count):
        data = os.urandom(3 * BLOCK + 1000 * (k + 1) + seed)
        key = f"{prefix}/shard {k}+x.bin"
        net.s3.put_object(Bucket="netns", Key=key, Body=data)
        objs[key] = hashlib.md5(data).hexdigest()
    return objs


def origin_bytes(net, agents):
    return sum(net.cluster(i)["cache"]["origin_bytes"] for i in agents)


def read_everywhere(net, agents, objs, job=None):
    """Every agent of `agents` reads every object at once (for `job`, if given); returns the failures."""
    failures = []

    def one(i, key):
        try:
            got = hashlib.md5(net.read(i, key, job)).hexdigest()
            if got != objs[key]:
                failures.append(f"agent {i} {key}: wrong bytes")
        except Exception as e:  # noqa: BLE001 - a failed read is the finding
            failures.append(f"agent {i} {key}: {e}")

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: one(*a), [(i, k) for i in agents for k in objs]))
    return failures


def test_four_hosts_read_a_cold_dataset_from_the_origin_once(net):
    objs = dataset(net, "cold")
    size = sum(
        net.s3.head_object(Bucket="netns", Key=k)["ContentLength"] for k in objs)
    before = origin_bytes(net, range(1, N + 1))
    assert read_everywhere(net, range(1, N + 1), objs, job="job-42") == []
    got = origin_bytes(net, range(1, N + 1)) - before
    assert got == size, f"origin bytes {got} for a dataset of {size}"
    # The job's egress and peer traffic, as each agent accounts them (owners count the fills they made for
    # the job's requests from other hosts).
    io = [net.job_io(i, "job-42", "cold") for i in range(1, N + 1)]
    assert sum(j["origin_bytes"] for j in io) == size, io
    assert sum(j["peer_bytes"] for j in io) == sum(j["served_to_peers_bytes"] for j in io) == (N - 1) * size, io
    for i in range(1, N + 1):
        c = net.cluster(i)
        assert c["errors"] == 0 and c["corrupt"] == 0, c
        assert [m["id"] for m in c["members"]] == [f"http://{addr(j)}:{API_PORT}" for j in range(1, N + 1)]
        assert c["cache"]["peer_blocks"] > 0 and c["cache"]["served_to_peers"] > 0, c


def test_a_partitioned_host_fails_no_read_and_is_trusted_again_once_back(net):
    cut = N
    net.link(cut, "down")
    try:
        objs = dataset(net, "partition", seed=7)
        size = sum(net.s3.head_object(Bucket="netns", Key=k)["ContentLength"] for k in objs)
        survivors = range(1, N)
        before = origin_bytes(net, survivors)
        t0 = time.time()
        assert read_everywhere(net, survivors, objs) == [], "a partitioned peer failed reads"
        took = time.time() - t0
        got = origin_bytes(net, survivors) - before
        # The blocks the cut host owns go to their next owner, which reads them once for all survivors (each
        # survivor's first request to the cut host may still be in flight when another's times out, so allow
        # a few blocks more).
        assert size <= got <= size + 6 * BLOCK, f"origin bytes {got} for {size}"
        for i in survivors:
            # Suspect for a backoff (1 s at first, so it may be over already): the counters keep the record.
            c = net.cluster(i)
            assert c["errors"] + c["meta_failed"] > 0 and c["suspected"] > 0, c
        assert took < 60, took
    finally:
        net.link(cut, "up")
    # Back on the network: once its backoff runs out it is asked again, answers, and is trusted.
    objs = dataset(net, "rejoin", seed=11)
    served = net.cluster(cut)["cache"]["served_to_peers"]
    deadline = time.time() + 45
    while True:
        assert read_everywhere(net, range(1, N), objs) == []
        states = [{m["id"]: m["state"] for m in net.cluster(i)["members"]} for i in range(1, N)]
        if net.cluster(cut)["cache"]["served_to_peers"] > served and all(
                s[f"http://{addr(cut)}:{API_PORT}"] == "up" for s in states):
            break
        assert time.time() < deadline, f"the host never came back: {states}"
        objs = dataset(net, f"rejoin-{int(time.time() * 1000)}", count=4, seed=13)
        time.sleep(1)
