#!/usr/bin/env python3
"""What the benches' S3 server (moto) costs per ranged GET: one object read whole, then in ranges of each size
given, one request after another; the median seconds per object and the ratio to one whole GET.

moto keeps an object in a spooled temporary file and reads all of it for every GET, ranged or not, then cuts
the range out, so a request costs about the object's size, not the range's. On it, a sequential reader that
splits an object into N ranges pays about N whole reads; on S3 a range costs its own bytes and parallel ranges
are faster. This is why the agent's `max_request_size` moves the cold cells of the mount and staging benches.

    python3 bench/origin_ranges.py [--object-mib 128] [--ranges-mib 32,8] [--rounds 3]

Needs .venv (scripts/test.sh: moto, boto3).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import free_port, wait_port  # noqa: E402

import boto3  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--object-mib", type=int, default=128)
    ap.add_argument("--ranges-mib", default="32,8", help="range sizes to compare with one whole GET, in MiB")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    port = free_port()
    moto = subprocess.Popen([os.path.join(ROOT, ".venv", "bin", "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="bench",
                          aws_secret_access_key="bench", region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        size = a.object_mib << 20
        s3.put_object(Bucket="bench", Key="object", Body=os.urandom(size))

        def get(first, last):
            body = s3.get_object(Bucket="bench", Key="object", Range=f"bytes={first}-{last}")["Body"]
            n = 0
            while chunk := body.read(1 << 20):
                n += len(chunk)
            return n

        def per_object(req):
            times = []
            for _ in range(a.rounds):
                t = time.perf_counter()
                got = sum(get(o, min(size, o + req) - 1) for o in range(0, size, req))
                times.append(time.perf_counter() - t)
                if got != size:
                    sys.exit(f"read {got} bytes of {size}")
            return statistics.median(times)

        whole = per_object(size)
        print(f"moto, one {a.object_mib} MiB object, medians of {a.rounds}: seconds per object read")
        print(f"  whole (1 GET)          {whole:6.2f} s   1.00x")
        for mib in (int(x) for x in a.ranges_mib.split(",")):
            t = per_object(mib << 20)
            print(f"  {mib:4d} MiB ranges ({-(-a.object_mib // mib):3d} GETs) {t:6.2f} s   {t / whole:.2f}x")
    finally:
        moto.terminate()
        moto.wait()


if __name__ == "__main__":
    main()
