"""Fixtures for the gateway tests: a real S3 server (moto) as the origin and `strata serve` in front of it.

Every server is started on a free loopback port by the fixture that needs it and stopped afterwards. The
`strata` binary comes from STRATA_BIN (scripts/test.sh points it at the build the Rust tests used).
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import boto3
import pytest
from botocore.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
STRATA = os.environ.get("STRATA_BIN", os.path.join(ROOT, "target", "debug", "strata"))
ACCESS_KEY, SECRET_KEY = "gwtest-key", "gwtest-secret-0123456789"
# A key issued to one job (its `job` tag attributes its requests).
JOB_KEY, JOB_SECRET = "gwtest-job-key", "gwtest-job-secret-0123456789"
# Every agent route but /healthz needs a bearer token. Agents started by the tests share this administrator
# token (STRATA_ADMIN_TOKEN); clients (the strata package, the CLI) present it (STRATA_TOKEN).
ADMIN_TOKEN = "strata-test-admin-token-0123456789"
os.environ["STRATA_ADMIN_TOKEN"] = ADMIN_TOKEN
os.environ["STRATA_TOKEN"] = ADMIN_TOKEN



def poll(what, fn, timeout, every=0.2):
    """fn() until it returns a truthy value; its last value, or an AssertionError naming `what` (the one wait on a
    state of the tests: a test that expects something to happen waits for it here, never for a fixed time)."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


def api_get(url, token=ADMIN_TOKEN):
    """GET an agent API URL with the bearer token."""
    import urllib.request
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(req)
ORIGIN_KEY, ORIGIN_SECRET = "origin", "origin-secret"


_PORTS_GIVEN = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A loopback port nothing listens on, for a server a test starts on a fixed port (an agent whose peers
    and restarts need its address). Chosen below the kernel's ephemeral range: a port the kernel hands out for
    a bind to port 0 can go to any outgoing connection before the server binds it ("Address already in use",
    seen once in CI), while ports below that range are only ever taken by an explicit bind. Never the same port
    twice in one run."""
    low = min(_ephemeral_low(), 65536) - 1
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(10000, max(low, 10001))
        if port in _PORTS_GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def wait_port(port, proc=None, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def client(endpoint, key=ACCESS_KEY, secret=SECRET_KEY, region="us-east-1", **cfg):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **cfg),
    )


@pytest.fixture(scope="session")
def origin():
    """A moto S3 server: the origin the gateway's `origin` bucket fronts."""
    port = free_port()
    proc = subprocess.Popen([os.path.join(VENV_BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    endpoint = f"http://127.0.0.1:{port}"
    c = client(endpoint, ORIGIN_KEY, ORIGIN_SECRET)
    for b in ("gw-origin", "direct", "gw-buckets"):
        c.create_bucket(Bucket=b)
    yield endpoint
    proc.terminate()
    proc.wait()


class Gateway:
    """One `strata serve` process with an S3 gateway; restartable on the same data dir."""

    def __init__(self, origin_endpoint, umask=None, extra="", gateway_extra=""):
        self.umask = umask  # started under this umask (default: the test's)
        self.dir = tempfile.mkdtemp(prefix="strata-gw-")
        self.data = os.path.join(self.dir, "data")
        self.mount = os.path.join(self.data, "objects")
        self.cfg = os.path.join(self.dir, "strata.toml")
        with open(self.cfg, "w") as f:
            f.write(f"""
[cache]
block_size = "1MiB"
ram_capacity = "64MiB"
disk_capacity = "512MiB"

[retry]
max_retries = 2
initial_backoff = 10
max_backoff = 100

[gateway]
{gateway_extra}
[[gateway.keys]]
access_key = "{ACCESS_KEY}"
secret_key = "{SECRET_KEY}"
principal = "alice"
team = "vision"
[[gateway.keys]]
access_key = "{JOB_KEY}"
secret_key = "{JOB_SECRET}"
principal = "nightly"
team = "vision"
job = "nightly-eval"

[[backends]]
name = "default"
url = "file://{self.mount}"

[[backends]]
name = "origin"
url = "s3://gw-origin"
[backends.options]
endpoint = "{origin_endpoint}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
{extra}
""")
        os.makedirs(self.mount, exist_ok=True)
        # The canary sits next to the local mount: no request may ever read or change it.
        self.canary = os.path.join(self.data, "canary.txt")
        with open(self.canary, "w") as f:
            f.write("canary: must never be served or changed\n")
        self.proc = None
        self.start()

    def start(self):
        for f in ("s3.addr", "api.addr"):
            try:
                os.remove(os.path.join(self.data, f))
            except FileNotFoundError:
                pass
        self.proc = subprocess.Popen(
            [STRATA, "serve", "--config", self.cfg, "--data-dir", self.data,
             "--api-listen", getattr(self, "api_listen", "127.0.0.1:0"), "--s3-listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, STRATA_LOG="warn"),
            preexec_fn=None if self.umask is None else (lambda: os.umask(self.umask)))
        addr = os.path.join(self.data, "s3.addr")
        deadline = time.time() + 30
        while not (os.path.exists(addr) and open(addr).read().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError("strata serve exited: " + self.proc.stderr.read().decode())
            if time.time() > deadline:
                raise RuntimeError("strata serve did not start")
            time.sleep(0.05)
        self.endpoint = open(addr).read().strip()
        self.api = open(os.path.join(self.data, "api.addr")).read().strip()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def close(self):
        """Stop it and remove its directory (data dir, mount, cache)."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def client(self, **kw):
        return client(self.endpoint, **kw)

    def canary_intact(self):
        with open(self.canary) as f:
            return f.read() == "canary: must never be served or changed\n"


@pytest.fixture(scope="session")
def gateway(origin):
    g = Gateway(origin)
    yield g
    g.close()


@pytest.fixture()
def s3_env(origin, monkeypatch):
    """The AWS_* environment that points Strata's own S3 client (and `strata serve` started from the test) at
    the origin; returns a boto3 client of the origin."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", origin)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ORIGIN_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ORIGIN_SECRET)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    return client(origin, ORIGIN_KEY, ORIGIN_SECRET)
