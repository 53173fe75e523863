"""Reads through a catalog outage (issue 44, finding 7): an agent on a PostgreSQL catalog of the test's own keeps
serving the reads its principals could make a minute ago, through the gateway and the data plane, cached data
and data only at the origin alike, while PostgreSQL is stopped (connections refused) and while it is hung
(SIGSTOP: it accepts connections and never answers); writes are refused with a retryable error meanwhile, and
work again once it is back."""
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from conftest import Gateway
from test_tenancy import cli, cli_json


def _pg_bin():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return found[-1] if found else None


class Postgres:
    """A PostgreSQL server of this test's own on a free loopback port, run as the `postgres` user."""

    def __init__(self):
        self.bin = _pg_bin()
        if self.bin is None or shutil.which("runuser") is None:
            if os.environ.get("STRATA_REQUIRE_POSTGRES") == "1":
                raise AssertionError("PostgreSQL is required (STRATA_REQUIRE_POSTGRES=1) but not installed")
            pytest.skip("PostgreSQL is not installed")
        self.dir = tempfile.mkdtemp(prefix="strata-outage-pg-")
        shutil.chown(self.dir, "postgres", "postgres")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self._pg("initdb", "-D", f"{self.dir}/data", "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, tool, *args):
        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/{tool}", *args], check=True,
                       capture_output=True, timeout=120)

    def start(self):
        self._pg("pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/log", "-w", "-o",
                 f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self):
        self._pg("pg_ctl", "-D", f"{self.dir}/data", "-m", "immediate", "-w", "stop")

    def pids(self):
        """The postmaster and its children (from /proc: a fresh machine may lack pgrep)."""
        pid = int(open(f"{self.dir}/data/postmaster.pid").readline())
        children = []
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/stat") as f:
                    # pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        children.append(int(d))
            except (OSError, ValueError, IndexError):
                continue
        return [pid, *children]

    def signal(self, sig):
        for p in self.pids():
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass

    def close(self):
        try:
            self.signal(signal.SIGCONT)
            self.stop()
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _api(gw, method, path, token, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(gw.api + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _read(gw, token, loc):
    return _api(gw, "GET", "/v1/read?location=" + urllib.parse.quote(loc, safe=""), token)


@pytest.fixture()
def outage(origin):
    pg = Postgres()
    gw = Gateway(origin, extra=f"""
[catalog]
url = "{pg.url}"
""")
    try:
        for t in ("vision", "nlp"):
            cli(gw, "team", "create", t)
        cli(gw, "prefix", "own", "default", "nlp", "nlp")
        token = cli_json(gw, "token", "create", "--name", "o-reader", "--team", "vision", "--role", "reader")["token"]
        key = cli_json(gw, "token", "create", "--name", "o-s3", "--team", "vision", "--s3")
        s3 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=key["access_key"],
                          aws_secret_access_key=key["secret_key"], region_name="us-east-1",
                          config=Config(retries={"max_attempts": 1}, read_timeout=60, connect_timeout=10,
                                        s3={"addressing_style": "path"}))
        yield gw, pg, token, s3
    finally:
        gw.close()
        pg.close()


@pytest.mark.parametrize("how", ["stopped", "hung"])
def test_reads_go_on_through_a_catalog_outage_and_writes_wait_for_it(outage, how):
    gw, pg, token, s3 = outage
    hot = b"read before the outage " * 1000
    cold = b"never read before the outage " * 1000
    s3.put_object(Bucket="default", Key="vision/hot.bin", Body=hot)
    os.makedirs(os.path.join(gw.mount, "vision"), exist_ok=True)
    with open(os.path.join(gw.mount, "vision", "cold.bin"), "wb") as f:
        f.write(cold)
    with open(os.path.join(gw.mount, "nlp-secret.txt"), "wb") as f:
        f.write(b"x")
    assert _read(gw, token, "default/vision/hot.bin") == (200, hot)
    assert s3.get_object(Bucket="default", Key="vision/hot.bin")["Body"].read() == hot
    if how == "stopped":
        pg.stop()
    else:
        pg.signal(signal.SIGSTOP)
    try:
        # Past every cache's few seconds: the answers now come from the outage's grace.
        time.sleep(6)
        for _ in range(3):
            assert _read(gw, token, "default/vision/hot.bin") == (200, hot)
            assert _read(gw, token, "default/vision/cold.bin") == (200, cold)
            assert s3.get_object(Bucket="default", Key="vision/hot.bin")["Body"].read() == hot
            assert s3.get_object(Bucket="default", Key="vision/cold.bin")["Body"].read() == cold
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket="default", Prefix="vision/")["Contents"]]
            assert keys == ["vision/cold.bin", "vision/hot.bin"], keys
        # What was closed stays closed: ownership decisions are the cached ones, not none.
        s, body = _read(gw, token, "default/nlp/x")
        assert s == 403, (s, body)
        # A token the catalog never confirmed is not let in.
        s, body = _read(gw, "stk_" + "x" * 40, "default/vision/hot.bin")
        assert s in (401, 503), (s, body)
        # Writes need the catalog: refused, retryable, nothing stored.
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket="default", Key="vision/during.bin", Body=b"during")
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503, e.value.response
        assert not os.path.exists(os.path.join(gw.mount, "vision", "during.bin"))
    finally:
        if how == "stopped":
            pg.start()
        else:
            pg.signal(signal.SIGCONT)
    # Back: writes work again.
    deadline = time.time() + 60
    while True:
        try:
            s3.put_object(Bucket="default", Key="vision/after.bin", Body=b"after")
            break
        except ClientError:
            assert time.time() < deadline, "writes did not come back with the catalog"
            time.sleep(0.5)
    assert s3.get_object(Bucket="default", Key="vision/after.bin")["Body"].read() == b"after"
