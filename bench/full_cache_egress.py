#!/usr/bin/env python3
"""Origin egress of a shared cache reading a new data set with full caches, side by side with empty caches.

Three `strata serve` agents in a static cluster (bench/hung_peer.py's) in front of one moto S3 origin, each
with small tiers (--ram, --disk). For each build given (--bin, repeatable: old and new in one sitting), per
round:

- empty: a fresh cluster reads the new set, every agent every object at once (each in its own order);
- full: a fresh cluster first reads an old set three times through every agent (every tier full of blocks the
  policy counts as hot), then reads the new set the same way.

Egress is what the agents' fills read from the origin (`fill_bytes` of `GET /v1/cache`, summed over the
agents), over the new set's size. Target: full <= 1.02x, as empty.

    .venv/bin/python bench/full_cache_egress.py [--bin target/release/strata ...] [--rounds 3]

Needs .venv (scripts/test.sh makes it). Results go to bench/out/full_cache_egress.json.
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from hung_peer import TOKEN, moto, read, s3, save, start_cluster  # noqa: E402

MIB = 1 << 20


def fills(agents):
    total = 0
    for a in agents:
        req = urllib.request.Request(f"{a['api']}/v1/cache", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            total += json.loads(r.read())["fill_bytes"]
    return total


def epoch(agents, keys):
    tasks = [(a["api"], k) for i, a in enumerate(agents) for k in random.Random(i).sample(keys, len(keys))]
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        list(ex.map(lambda t: read(*t), tasks))


def one(binary, origin, bucket, old, new, full, ram, disk):
    root = tempfile.mkdtemp(prefix="strata-bench-full-")
    agents = start_cluster(binary, origin, bucket, root, ram=ram, disk=disk)
    try:
        if full:
            for _ in range(3):
                epoch(agents, old)
        before = fills(agents)
        epoch(agents, new)
        return fills(agents) - before
    finally:
        for a in agents:
            a["proc"].send_signal(signal.SIGKILL)
            a["proc"].wait()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", help="a strata binary (repeat for an A/B)")
    ap.add_argument("--old-mib", type=int, default=96, help="the old set (fills the tiers)")
    ap.add_argument("--new-mib", type=int, default=24, help="the new set (measured; keep each owner's share under its tiers)")
    ap.add_argument("--ram", default="16MiB")
    ap.add_argument("--disk", default="16MiB")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bins = a.bin or [os.path.join(ROOT, "target", "release", "strata")]
    with moto() as origin:
        c = s3(origin)
        c.create_bucket(Bucket="egress")
        old = [f"old/{i:03d}" for i in range(a.old_mib)]
        new = [f"new/{i:03d}" for i in range(a.new_mib)]
        for k in old + new:
            c.put_object(Bucket="egress", Key=k, Body=os.urandom(MIB))
        size = a.new_mib * MIB
        res = {b: {"empty": [], "full": []} for b in bins}
        for r in range(a.rounds):
            for b in bins:
                for mode in ("empty", "full"):
                    x = one(b, origin, "egress", old, new, mode == "full", a.ram, a.disk) / size
                    res[b][mode].append(x)
                    print(f"round {r} {b} {mode}: {x:.3f}x the set", flush=True)
        print()
        for b in bins:
            e, f = statistics.median(res[b]["empty"]), statistics.median(res[b]["full"])
            print(f"{b}: egress empty {e:.3f}x, full {f:.3f}x (full / empty {f / e:.2f})")
        save("full_cache_egress", res)


if __name__ == "__main__":
    main()
