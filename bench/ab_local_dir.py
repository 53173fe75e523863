#!/usr/bin/env python3
"""A/B of two `strata` builds on the S3 gateway over a local-directory bucket (`file://`), in one sitting.

What the local-directory backend does per request is what differs between builds (the key -> file mapping of
`localkeys`, the content MD5 recorded in an xattr on every write and read back by reads, HEADs and listings,
attributes kept in xattrs), so each workload runs through a fresh `strata serve` whose only bucket is a fresh
directory on the same disk (under --work):

  put-64k    PUT of 2,000 x 64 KiB objects, s5cmd with 16 workers                         objects/s
  get-cold   GET of those 2,000 through a fresh agent (empty cache), s5cmd 16 workers     MiB/s
  get-hot    the same GET again through that agent (second pass)                          MiB/s
  list       list_objects_v2 of 20,000 x 1 KiB objects, 1000 a page (boto3), fresh agent  keys/s
             (the objects are PUT with s5cmd through the gateway first, not timed)
  head-cold  HEAD of the 2,000 x 64 KiB objects, fresh agent, boto3 with 16 threads       ops/s
  put-64m    PUT of 16 x 64 MiB objects, s5cmd 16 workers (multipart: 50 MiB parts)       MiB/s

Each round runs every workload with both builds back to back (A then B in odd rounds, B then A in even ones:
interleaved, so that the load of a shared machine falls on both alike). It prints, per workload, the median
of each build, the ratio new/old (> 1: the new build is faster), the spread (min-max) of each, and the median
CPU seconds `strata serve` spent in the timed part (steadier than wall time on a shared machine: s5cmd and
boto3 share the cores, and the GET and HEAD workloads are mostly client-bound). The page cache is dropped
(sync + drop_caches, as root) before each PUT workload and before the timed listing; the GETs and HEADs read
the bucket's files from the page cache their PUT left (cold means Strata's cache, not the kernel's). The
sources s5cmd uploads and the files it downloads live in /dev/shm, so that only the bucket's files are on disk.

    .venv/bin/python bench/ab_local_dir.py --old /tmp/strata-A --new /tmp/strata-B [--rounds 3]
        [--only put-64k,get-cold,get-hot,list,head-cold,put-64m] [--work /tmp] [--scale 1]

Needs .venv (scripts/test.sh: s5cmd, boto3) and the two release builds (copy target/release/strata of each
commit aside). Raw numbers land in bench/out/ab_local_dir.json.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import warm_vs_s5cmd  # noqa: E402
from warm_vs_s5cmd import cpu_seconds, settle, start_serve  # noqa: E402

AK, SK = "benchkey", "bench-secret-key"
BUCKET = "bench"
SMALL_N, SMALL_SIZE = 2000, 64 << 10
LIST_N, LIST_SIZE = 20000, 1 << 10
LARGE_N, LARGE_SIZE = 16, 64 << 20
WORKLOADS = ["put-64k", "get-cold", "get-hot", "list", "head-cold", "put-64m"]
UNITS = {"put-64k": "objects/s", "get-cold": "MiB/s", "get-hot": "MiB/s", "list": "keys/s",
         "head-cold": "ops/s", "put-64m": "MiB/s"}


def s5(endpoint, *args, workers=16):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_REGION="us-east-1")
    cmd = [os.path.join(VENV, "s5cmd"), "--endpoint-url", endpoint, "--numworkers", str(workers)]
    t0 = time.perf_counter()
    subprocess.run(cmd + list(args), env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


class Agent:
    """`strata serve` of build `binary` with one local-directory bucket at `bucket_dir` and its own (empty) data
    dir: a fresh agent over an existing directory has a cold cache."""

    def __init__(self, binary, work, bucket_dir):
        self.data = tempfile.mkdtemp(prefix="agent-", dir=work)
        cfg = os.path.join(self.data, "strata.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[cache]
ram_capacity = "1GiB"
disk_capacity = "4GiB"

[gateway]
[[gateway.keys]]
access_key = "{AK}"
secret_key = "{SK}"

[[backends]]
name = "{BUCKET}"
url = "file://{bucket_dir}"
""")
        warm_vs_s5cmd.STRATA = binary
        self.proc, endpoint = start_serve(cfg, self.data, addr="s3.addr")
        self.endpoint = endpoint if endpoint.startswith("http") else f"http://{endpoint}"

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)


def boto(endpoint):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=AK, aws_secret_access_key=SK,
                        region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, max_pool_connections=32,
                                      retries={"max_attempts": 1}))


def timed(agent, fn):
    """(seconds, agent CPU seconds) of fn()."""
    c0 = agent.cpu()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0, agent.cpu() - c0


def fresh_dir(work, tag):
    d = tempfile.mkdtemp(prefix=f"bucket-{tag}-", dir=work)
    return d


def check_download(dst, n, size):
    files = [os.path.join(r, f) for r, _, fs in os.walk(dst) for f in fs]
    total = sum(os.path.getsize(f) for f in files)
    assert len(files) == n and total == n * size, (dst, len(files), total)


def run_small(binary, tag, work, shm, src, only):
    """put-64k, then get-cold and get-hot through a fresh agent, then head-cold through another one."""
    out = {}
    bucket = fresh_dir(work, tag)
    try:
        settle()
        agent = Agent(binary, work, bucket)
        try:
            dt, cpu = timed(agent, lambda: s5(agent.endpoint, "cp", src + "/*", f"s3://{BUCKET}/small/"))
        finally:
            agent.stop()
        if "put-64k" in only:
            out["put-64k"] = (SMALL_N / dt, cpu, dt)
        if "get-cold" in only or "get-hot" in only:
            os.sync()
            agent = Agent(binary, work, bucket)
            try:
                for phase in ("get-cold", "get-hot"):
                    dst = os.path.join(shm, "get")
                    shutil.rmtree(dst, ignore_errors=True)
                    dt, cpu = timed(agent, lambda: s5(agent.endpoint, "cp", f"s3://{BUCKET}/small/*", dst + "/"))
                    check_download(dst, SMALL_N, SMALL_SIZE)
                    shutil.rmtree(dst, ignore_errors=True)
                    out[phase] = (SMALL_N * SMALL_SIZE / (1 << 20) / dt, cpu, dt)
            finally:
                agent.stop()
        if "head-cold" in only:
            agent = Agent(binary, work, bucket)
            try:
                c = boto(agent.endpoint)
                c.list_buckets()  # the client's setup, not timed
                keys = [f"small/obj-{i:05}.bin" for i in range(SMALL_N)]

                def heads():
                    with concurrent.futures.ThreadPoolExecutor(16) as ex:
                        sizes = list(ex.map(lambda k: c.head_object(Bucket=BUCKET, Key=k)["ContentLength"], keys))
                    assert sizes == [SMALL_SIZE] * SMALL_N

                dt, cpu = timed(agent, heads)
                out["head-cold"] = (SMALL_N / dt, cpu, dt)
            finally:
                agent.stop()
    finally:
        shutil.rmtree(bucket, ignore_errors=True)
    return out


def run_list(binary, tag, work, src):
    bucket = fresh_dir(work, tag)
    try:
        agent = Agent(binary, work, bucket)
        try:
            s5(agent.endpoint, "cp", src + "/*", f"s3://{BUCKET}/list/")
        finally:
            agent.stop()
        settle()
        agent = Agent(binary, work, bucket)
        try:
            c = boto(agent.endpoint)
            c.list_buckets()
            seen = []

            def listing():
                for page in c.get_paginator("list_objects_v2").paginate(
                        Bucket=BUCKET, Prefix="list/", PaginationConfig={"PageSize": 1000}):
                    seen.extend(o["Key"] for o in page.get("Contents", []))

            dt, cpu = timed(agent, listing)
            assert len(seen) == LIST_N, len(seen)
        finally:
            agent.stop()
    finally:
        shutil.rmtree(bucket, ignore_errors=True)
    return {"list": (LIST_N / dt, cpu, dt)}


def run_large(binary, tag, work, src):
    bucket = fresh_dir(work, tag)
    try:
        settle()
        agent = Agent(binary, work, bucket)
        try:
            dt, cpu = timed(agent, lambda: s5(agent.endpoint, "cp", src + "/*", f"s3://{BUCKET}/large/"))
        finally:
            agent.stop()
        sizes = [os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(bucket) for f in fs
                 if os.path.basename(r) == "large"]
        assert sizes == [LARGE_SIZE] * LARGE_N, sizes
    finally:
        shutil.rmtree(bucket, ignore_errors=True)
    return {"put-64m": (LARGE_N * LARGE_SIZE / (1 << 20) / dt, cpu, dt)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the baseline `strata` binary (A)")
    ap.add_argument("--new", required=True, help="the `strata` binary under test (B)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads to run, comma-separated")
    ap.add_argument("--work", default="/tmp", help="where the bucket directories and agent data dirs go (disk)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply the object counts (a smoke test of the script: --scale 0.1)")
    a = ap.parse_args()
    global SMALL_N, LIST_N, LARGE_N
    SMALL_N, LIST_N, LARGE_N = (max(1, int(n * a.scale)) for n in (SMALL_N, LIST_N, LARGE_N))
    only = [w for w in a.only.split(",") if w]
    for w in only:
        if w not in WORKLOADS:
            sys.exit(f"unknown workload {w!r}; known: {','.join(WORKLOADS)}")
    if "get-hot" in only and "get-cold" not in only:
        # the hot pass is the cold pass's second read: both are measured
        only.append("get-cold")
    bins = {"old": os.path.abspath(a.old), "new": os.path.abspath(a.new)}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            sys.exit(f"not an executable: {b}")
    work = tempfile.mkdtemp(prefix="strata-ab-", dir=a.work)
    shm = tempfile.mkdtemp(prefix="strata-ab-", dir="/dev/shm" if os.path.isdir("/dev/shm") else a.work)
    results = {w: {"old": [], "new": []} for w in only}
    try:
        srcs = {}
        for name, n, size in (("small", SMALL_N, SMALL_SIZE), ("list", LIST_N, LIST_SIZE),
                              ("large", LARGE_N, LARGE_SIZE)):
            d = os.path.join(shm, "src-" + name)
            os.makedirs(d)
            for i in range(n):
                with open(os.path.join(d, f"obj-{i:05}.bin"), "wb") as f:
                    f.write(os.urandom(size))
            srcs[name] = d
        print(f"old = {bins['old']}\nnew = {bins['new']}\nwork = {work} (buckets, agents), {shm} (sources)")
        small = [w for w in only if w in ("put-64k", "get-cold", "get-hot", "head-cold")]
        groups = []
        if small:
            groups.append(lambda b, tag: run_small(bins[b], tag, work, shm, srcs["small"], small))
        if "list" in only:
            groups.append(lambda b, tag: run_list(bins[b], tag, work, srcs["list"]))
        if "put-64m" in only:
            groups.append(lambda b, tag: run_large(bins[b], tag, work, srcs["large"]))
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for g in groups:
                for b in order:
                    got = g(b, f"{b}{r}")
                    for w, (rate, cpu, dt) in got.items():
                        results[w][b].append({"rate": rate, "agent_cpu_s": cpu, "s": dt})
                        print(f"round {r + 1} {w:9} {b}: {rate:10.1f} {UNITS[w]:9} ({dt:6.2f} s, agent cpu "
                              f"{cpu:6.2f} s)", flush=True)
        summary = {}
        print(f"\n{'workload':10} {'unit':9} {'old median':>11} {'new median':>11} {'new/old':>8}   "
              f"{'old min-max':>19} {'new min-max':>19}   agent cpu s old/new (median)")
        for w in only:
            o = [x["rate"] for x in results[w]["old"]]
            n = [x["rate"] for x in results[w]["new"]]
            oc = statistics.median(x["agent_cpu_s"] for x in results[w]["old"])
            nc = statistics.median(x["agent_cpu_s"] for x in results[w]["new"])
            mo, mn = statistics.median(o), statistics.median(n)
            summary[w] = {"unit": UNITS[w], "old_median": round(mo, 1), "new_median": round(mn, 1),
                          "ratio_new_over_old": round(mn / mo, 3), "old_min_max": [round(min(o), 1), round(max(o), 1)],
                          "new_min_max": [round(min(n), 1), round(max(n), 1)],
                          "agent_cpu_s_median": {"old": round(oc, 2), "new": round(nc, 2)}}
            print(f"{w:10} {UNITS[w]:9} {mo:11.1f} {mn:11.1f} {mn / mo:8.3f}   "
                  f"{min(o):8.1f} - {max(o):8.1f} {min(n):8.1f} - {max(n):8.1f}   {oc:.2f} / {nc:.2f}")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "out", "ab_local_dir.json"), "w") as f:
            json.dump({"old": bins["old"], "new": bins["new"], "rounds": a.rounds, "summary": summary,
                       "raw": results}, f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
