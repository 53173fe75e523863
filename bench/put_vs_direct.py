#!/usr/bin/env python3
"""Single PutObjects of bodies past what the gateway buffers (8 MiB), side by side in one run: straight at the
origin (moto) and through the gateway of each `strata` binary given (A/B of builds), one client thread per
stream, `--streams` at once. Prints each way's median seconds per round, its ratio to direct, and the ETag
form each way stores (a single PUT's is the body's MD5; a multipart upload's `<md5>-N`).

    python3 bench/put_vs_direct.py --bin OLD --bin NEW [--size-mib 64] [--count 8] [--streams 4] [--rounds 3]

Needs .venv (scripts/test.sh).
"""
import argparse
import concurrent.futures
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import boto3
from botocore.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import warm_vs_s5cmd  # noqa: E402
from gateway_vs_direct import AK, SK, Agent  # noqa: E402
from warm_vs_s5cmd import free_port, wait_port  # noqa: E402


def s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SK,
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=64,
                                      retries={"max_attempts": 1}))


def gateway(binary, work, origin, n):
    """A gateway of `binary` in front of the origin's bucket `bench` (gateway_vs_direct's, a data dir each)."""
    warm_vs_s5cmd.STRATA = binary
    return Agent(work, origin, ttl_ms=60_000 + n)


def put_all(client, bucket, prefix, bodies, streams):
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(streams) as ex:
        etags = list(ex.map(lambda kv: client.put_object(Bucket=bucket, Key=f"{prefix}/{kv[0]}", Body=kv[1])["ETag"],
                            enumerate(bodies)))
    return time.time() - start, etags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="a strata binary (give two for an A/B)")
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="strata-put-")
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agents = []
    try:
        wait_port(port)
        origin = f"http://127.0.0.1:{port}"
        s3(origin).create_bucket(Bucket="bench")
        bodies = [os.urandom(a.size_mib << 20) for _ in range(a.count)]
        md5s = {f'"{hashlib.md5(b).hexdigest()}"' for b in bodies}
        ways = {"direct": s3(origin)}
        for i, b in enumerate(a.bin):
            g = gateway(b, work, origin, i)
            agents.append(g.proc)
            ways[f"gateway {i} ({b})"] = s3(g.endpoint if g.endpoint.startswith("http") else f"http://{g.endpoint}")
        times = {w: [] for w in ways}
        forms = {}
        print(f"{a.count} x {a.size_mib} MiB single PutObjects, {a.streams} at once, {a.rounds} rounds; origin moto")
        for r in range(a.rounds):
            # Each round in a rotated order, so no way always goes first.
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for w in order:
                t, etags = put_all(ways[w], "bench", f"r{r}-w{list(ways).index(w)}", bodies, a.streams)
                times[w].append(t)
                forms[w] = "md5" if set(etags) <= md5s else f"other ({etags[0]})"
        base = statistics.median(times["direct"])
        total = a.count * a.size_mib
        for w, ts in times.items():
            m = statistics.median(ts)
            print(f"  {w:40s} median {m:6.2f} s ({total / m:7.1f} MiB/s), min {min(ts):.2f} max {max(ts):.2f}; "
                  f"x{m / base:.2f} of direct; ETag: {forms[w]}")
    finally:
        for p in agents:
            p.terminate()
            p.wait()
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
