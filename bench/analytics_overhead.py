#!/usr/bin/env python3
"""What access analytics cost the gateway's hot paths: the same build with `[analytics] enabled = true` and
`false`, side by side in one sitting (runs alternate on, off, on, off, ...).

Each run is `bench/gateway_vs_direct.py` (s5cmd, 16 workers) over 8 x 64 MiB and 2,000 x 16 KiB objects plus the
one-connection 16 KiB GET latency; this script reads the hot rounds' times and the latency of each run and
prints, per cell, the median with analytics on and off and their ratio (on / off time: 1.03 is 3% slower).
Target: <= 1.03 on every cell (issue: telemetry's cost on the hot paths).

    .venv/bin/python bench/analytics_overhead.py [--pairs 2] [--large-mib 512] [--small-count 2000]
    .venv/bin/python bench/analytics_overhead.py --loader [--pairs 2] [--small 3000] [--large 100]

Needs what gateway_vs_direct.py needs (.venv, a release build or STRATA_BENCH_BIN). `--loader` instead runs
`bench/loader_vs_baselines.py --only strata-wds-agent,strata-mds-agent` (a StreamingDataset reading through a
node agent, whose analytics record every read) with the agent's analytics on and off, and compares samples/s
(epoch 1 cold, epoch 2 warm) as seconds per 1,000 samples (on / off: 1.03 is 3% slower).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, ".venv", "bin", "python")


def run(on, a):
    extra = "" if on else "[analytics];enabled = false"
    cmd = [PY, os.path.join(ROOT, "bench", "gateway_vs_direct.py"), "--sets", "large,small", "--large-mib",
           str(a.large_mib), "--small-count", str(a.small_count), "--rounds", str(a.rounds), "--skip-nginx",
           "--wrk-rounds", "0", "--cache-extra", extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    cells = {"large hot s": [], "small hot s": []}
    for m in re.finditer(r"^(large|small) \(metadata ttl \d+ ms\) round \d+: .*? hot ([\d.]+) s", out, re.M):
        cells[f"{m.group(1)} hot s"].append(float(m.group(2)))
    lat = re.search(r"gateway hot p50 ([\d.]+) ms / p99 ([\d.]+) ms", out)
    if not lat or not all(cells.values()):
        sys.exit("could not read gateway_vs_direct.py's output:\n" + out)
    return {
        "large hot s": statistics.median(cells["large hot s"]),
        "small hot s": statistics.median(cells["small hot s"]),
        "16 KiB GET p50 ms": float(lat.group(1)),
        "16 KiB GET p99 ms": float(lat.group(2)),
    }


def run_loader(on, a):
    extra = "" if on else "[analytics];enabled = false"
    cmd = [PY, os.path.join(ROOT, "bench", "loader_vs_baselines.py"), "--only", "strata-wds-agent,strata-mds-agent",
           "--small", str(a.small), "--large", str(a.large), "--rounds", "1", "--resume-samples", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env=dict(os.environ, STRATA_BENCH_AGENT_EXTRA=extra)).stdout
    cells = {}
    for m in re.finditer(r"^(small|large)\s+(strata-\S+-agent)\s+([\d.]+)\s+([\d.]+)", out, re.M):
        name, kind, cold, warm = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
        cells[f"{name} {kind.removeprefix('strata-')} cold s/1k"] = 1000 / cold
        cells[f"{name} {kind.removeprefix('strata-')} warm s/1k"] = 1000 / warm
    if not cells:
        sys.exit("could not read loader_vs_baselines.py's output:\n" + out)
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2, help="on/off pairs (runs alternate)")
    ap.add_argument("--large-mib", type=int, default=512)
    ap.add_argument("--small-count", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loader", action="store_true", help="the loader through an agent instead of the gateway")
    ap.add_argument("--small", type=int, default=3000, help="--loader: samples of ~100 KiB")
    ap.add_argument("--large", type=int, default=100, help="--loader: samples of ~4 MiB")
    a = ap.parse_args()
    res = {True: [], False: []}
    for i in range(a.pairs):
        for on in (True, False) if i % 2 == 0 else (False, True):
            r = run_loader(on, a) if a.loader else run(on, a)
            res[on].append(r)
            print(f"run {len(res[True]) + len(res[False])} analytics {'on ' if on else 'off'}: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    print(f"\n{'cell':32} on (median)  off (median)  on/off  (target <= 1.03)")
    for k in res[True][0]:
        on = statistics.median(r[k] for r in res[True] if k in r)
        off = statistics.median(r[k] for r in res[False] if k in r)
        print(f"{k:32} {on:11.3f} {off:13.3f}  {on / off:6.3f}")


if __name__ == "__main__":
    main()
