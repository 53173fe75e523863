#!/usr/bin/env python3
"""Reads and writes of a shared cache while one member is hung, side by side with the same cluster healthy.

Three `strata serve` agents in a static cluster in front of one moto S3 origin. In each round, for each build
given (--bin, repeatable: an A/B of old and new in one sitting), two passes over a fresh cluster:

- healthy: every object read through both of the first two agents (concurrently), cold;
- hung: the same on a fresh cluster whose third agent is SIGSTOPped first (it still accepts connections: the
  kernel completes the handshake), then writes through the first agent's gateway once the hung member's
  metadata lease is over.

It prints, per build, the median over rounds of each pass's read latency (p50, p99, max, seconds), the ratio
hung / healthy of the max, and the write latencies in the hung pass (target: no read stalls longer than 1 s,
writes after the lease wait for nothing).

    .venv/bin/python bench/hung_peer.py [--bin target/release/strata ...] [--objects 48] [--rounds 3]

Needs .venv (scripts/test.sh makes it). Results go to bench/out/hung_peer.json.
"""
import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import boto3
from botocore.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import free_port, wait_port  # noqa: E402

KEY, SECRET = "bench", "benchsecret"
TOKEN = "strata-bench-admin-token-0123456789"
LEASE_MS = 3000


@contextlib.contextmanager
def moto():
    """A moto S3 server on a free loopback port, for the duration: its endpoint."""
    port = free_port()
    proc = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()


def save(name, results):
    """`results` as bench/out/NAME.json."""
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", f"{name}.json"), "w") as f:
        json.dump(results, f, indent=1)


def s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                        region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))


def start_cluster(binary, origin, bucket, root, n=3, peer_timeout_ms=10000, ram="256MiB", disk="512MiB"):
    ports = [free_port() for _ in range(n)]
    peers = json.dumps([f"127.0.0.1:{p}" for p in ports])
    agents = []
    for i, p in enumerate(ports):
        d = os.path.join(root, f"agent{i}")
        os.makedirs(d)
        s3_port = free_port()
        cfg = os.path.join(d, "strata.toml")
        with open(cfg, "w") as f:
            f.write(f"""data_dir = "{d}/data"
[api]
listen = "127.0.0.1:{p}"
[gateway]
listen = "127.0.0.1:{s3_port}"
[[gateway.keys]]
access_key = "{KEY}"
secret_key = "{SECRET}"
[cache]
block_size = "1MiB"
ram_capacity = "{ram}"
disk_capacity = "{disk}"
[[backends]]
name = "default"
url = "s3://{bucket}"
[backends.options]
endpoint = "{origin}"
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"
[cluster]
peers = {peers}
cache = "static"
peer_timeout_ms = {peer_timeout_ms}
metadata_lease_ms = {LEASE_MS}
""")
        env = dict(os.environ, STRATA_LOG="warn", STRATA_CLUSTER_SECRET="bench-cluster-secret-0123456789",
                   STRATA_ADMIN_TOKEN=TOKEN)
        log = open(os.path.join(d, "log"), "wb")
        proc = subprocess.Popen([binary, "serve", "--config", cfg], stdout=log, stderr=subprocess.STDOUT, env=env)
        agents.append({"proc": proc, "api": f"http://127.0.0.1:{p}", "port": p, "s3": s3_port})
    for a in agents:
        wait_port(a["port"])
        wait_port(a["s3"])
    return agents


def read(api, key):
    req = urllib.request.Request(f"{api}/v1/read?location=" + urllib.parse.quote(f"default/{key}", safe=""),
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    start = time.time()
    with urllib.request.urlopen(req, timeout=300) as r:
        r.read()
    return time.time() - start


def one_pass(binary, origin, bucket, keys, hang):
    root = tempfile.mkdtemp(prefix="strata-bench-hung-")
    agents = start_cluster(binary, origin, bucket, root)
    try:
        if hang:
            agents[2]["proc"].send_signal(signal.SIGSTOP)
        tasks = [(a["api"], k) for k in keys for a in agents[:2]]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            lat = sorted(ex.map(lambda t: read(*t), tasks))
        out = {"p50": statistics.median(lat), "p99": lat[int(0.99 * (len(lat) - 1))], "max": lat[-1]}
        if hang:
            time.sleep(LEASE_MS / 1000 + 1)
            c = s3(f"http://127.0.0.1:{agents[0]['s3']}")
            waits = []
            for i in range(10):
                start = time.time()
                c.put_object(Bucket="default", Key=f"written/{i}", Body=b"w" * 4096)
                waits.append(time.time() - start)
            out["write_max"] = max(waits)
            out["write_p50"] = statistics.median(waits)
        return out
    finally:
        for a in agents:
            a["proc"].send_signal(signal.SIGCONT)
            a["proc"].kill()
            a["proc"].wait()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", help="a strata binary (repeat for an A/B)")
    ap.add_argument("--objects", type=int, default=48)
    ap.add_argument("--size-kib", type=int, default=1536)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bins = a.bin or [os.path.join(ROOT, "target", "release", "strata")]
    with moto() as origin:
        results = {b: {"healthy": [], "hung": []} for b in bins}
        for r in range(a.rounds):
            for b in bins:
                for mode in ("healthy", "hung"):
                    bucket = f"hung-{r}-{bins.index(b)}-{mode}"
                    c = s3(origin)
                    c.create_bucket(Bucket=bucket)
                    keys = [f"obj-{i:03d}" for i in range(a.objects)]
                    for k in keys:
                        c.put_object(Bucket=bucket, Key=k, Body=os.urandom(a.size_kib * 1024))
                    res = one_pass(b, origin, bucket, keys, mode == "hung")
                    results[b][mode].append(res)
                    print(f"round {r} {os.path.basename(os.path.dirname(b)) or b} {mode}: "
                          + ", ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
        print()
        for b in bins:
            med = {m: {k: statistics.median(x[k] for x in results[b][m]) for k in results[b][m][0]}
                   for m in ("healthy", "hung")}
            print(f"{b}:")
            for m in ("healthy", "hung"):
                print(f"  {m:8s} " + ", ".join(f"{k} {v:.3f} s" for k, v in med[m].items()))
            print(f"  max read latency hung / healthy: {med['hung']['max'] / med['healthy']['max']:.2f}x")
        save("hung_peer", results)


if __name__ == "__main__":
    main()
