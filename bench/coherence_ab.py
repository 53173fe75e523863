#!/usr/bin/env python3
"""What read-after-write across agents costs: two `strata` binaries (before and after the announcements of
writes to every member, `cluster/coherence.rs`) side by side in one run, same cluster, same origin.

Three agents on loopback (`[cluster] cache = "static"`, default metadata TTL) in front of one moto server, each
with its S3 gateway. Per binary and round, fresh agents:

1. PUT: 4 KiB objects through agent 0's gateway (boto3), one at a time: the old binary answers after the
   origin's; the new one also after both members dropped the key (one request each, in parallel).
2. Hot GET: the same objects read back through agent 1's gateway (metadata and blocks cached): the read path
   gained a lease check.
3. PUT with a member dead: agent 2 SIGKILLed, then (past one lease) PUTs again: each announcement to the dead
   member is one refused connection.

Prints per-operation medians (ms) per binary and the ratio new / old; rounds alternate the binaries' order.

    .venv/bin/python bench/coherence_ab.py --old PATH --new PATH [--ops 300] [--rounds 3]

Needs .venv (scripts/test.sh makes it).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import free_port, wait_port  # noqa: E402

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402

KEY, SECRET = "ab-key", "ab-secret-0123456789abcdef"
ORIGIN_KEY, ORIGIN_SECRET = "testing", "testing"
CLUSTER_SECRET = "coherence-ab-secret-0123456789"
TOKEN = "coherence-ab-admin-token-0123456789"


def s3(endpoint, key, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1", config=Config(retries={"max_attempts": 1}))


def start_agents(binary, root, origin, bucket, n=3):
    ports = [(free_port(), free_port()) for _ in range(n)]
    peers = json.dumps([f"127.0.0.1:{a}" for a, _ in ports])
    procs = []
    for i, (api, gw) in enumerate(ports):
        d = os.path.join(root, f"a{i}")
        os.makedirs(d)
        cfg = os.path.join(d, "strata.toml")
        with open(cfg, "w") as f:
            f.write(f"""
data_dir = "{d}/data"
[api]
listen = "127.0.0.1:{api}"
[gateway]
listen = "127.0.0.1:{gw}"
[[gateway.keys]]
access_key = "{KEY}"
secret_key = "{SECRET}"
principal = "bench"
[cache]
ram_capacity = "256MiB"
disk_enabled = false
[[backends]]
name = "default"
url = "s3://{bucket}"
[backends.options]
endpoint = "{origin}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
region = "us-east-1"
[cluster]
cache = "static"
peers = {peers}
peer_timeout_ms = 2000
""")
        env = dict(os.environ, STRATA_CLUSTER_SECRET=CLUSTER_SECRET, STRATA_ADMIN_TOKEN=TOKEN, STRATA_LOG="error")
        log = open(os.path.join(d, "log"), "wb")
        procs.append(subprocess.Popen([binary, "serve", "--config", cfg], stdout=log, stderr=subprocess.STDOUT,
                                      env=env))
    for (api, _), p in zip(ports, procs):
        wait_port(api)
    # Every member in contact (the new binary trusts its metadata only then).
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            st = [json.load(urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{api}/v1/cluster", headers={"Authorization": f"Bearer {TOKEN}"})))
                for api, _ in ports]
            if all(s.get("coherence", {"trusted": True})["trusted"] for s in st):
                break
        except OSError:
            pass
        time.sleep(0.1)
    return ports, procs


def timed(fn, ops):
    out = []
    for i in range(ops):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def one_round(binary, origin, ops, tag):
    root = tempfile.mkdtemp(prefix="strata-coh-ab-")
    bucket = f"ab-{tag}"
    s3(origin, ORIGIN_KEY, ORIGIN_SECRET).create_bucket(Bucket=bucket)
    ports, procs = start_agents(binary, root, origin, bucket)
    try:
        w = s3(f"http://127.0.0.1:{ports[0][1]}", KEY, SECRET)
        r = s3(f"http://127.0.0.1:{ports[1][1]}", KEY, SECRET)
        body = os.urandom(4096)
        w.put_object(Bucket="default", Key="warm", Body=body)
        put = timed(lambda i: w.put_object(Bucket="default", Key=f"k/{i:05d}", Body=body), ops)
        for i in range(ops):
            r.get_object(Bucket="default", Key=f"k/{i:05d}")["Body"].read()
        get = timed(lambda i: r.get_object(Bucket="default", Key=f"k/{i:05d}")["Body"].read(), ops)
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait()
        # Past one lease (5 s by default): no write waits for the dead member's lease any more.
        time.sleep(6)
        dead = timed(lambda i: w.put_object(Bucket="default", Key=f"d/{i:05d}", Body=body), ops)
        return {"put_ms": put, "hot_get_ms": get, "put_member_dead_ms": dead}
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    origin = f"http://127.0.0.1:{port}"
    try:
        wait_port(port)
        res = {"old": [], "new": []}
        for rnd in range(a.rounds):
            order = ["old", "new"] if rnd % 2 == 0 else ["new", "old"]
            for which in order:
                res[which].append(one_round(getattr(a, which), origin, a.ops, f"{which}-{rnd}"))
                print(which, rnd, res[which][-1], flush=True)
    finally:
        moto.kill()
        moto.wait()
    print(f"\n{'operation':<22}{'old ms':>10}{'new ms':>10}{'new/old':>10}")
    for m in ("put_ms", "hot_get_ms", "put_member_dead_ms"):
        old = statistics.median(r[m] for r in res["old"])
        new = statistics.median(r[m] for r in res["new"])
        print(f"{m:<22}{old:>10.2f}{new:>10.2f}{new / old:>9.2f}x")
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "coherence_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
