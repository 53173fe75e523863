#!/usr/bin/env python3
"""`strata usage reconcile` vs `s5cmd du` over the same bucket, side by side in one run.

Both list every object of one bucket on the same S3 server (moto, on loopback) and total the bytes: s5cmd with
`du "s3://bench/*"` (one paginated listing of the whole bucket), Strata with `strata usage reconcile origin`,
which lists the backend in parallel (16 listings in flight over the top-level prefixes) and writes the
inventory into the agent's catalog (SQLite in its data directory).

Setup (not timed, but reported): --objects objects of --object-bytes bytes across --prefixes top-level
prefixes are written as local files and uploaded with `s5cmd cp` (--upload-workers workers). Then, for
--rounds rounds, each round starts a fresh agent (empty catalog) with the bucket as backend `origin` and times:

  - `s5cmd du "s3://bench/*"` (placed before the agent's two reconciliations in odd rounds, after them in even
    ones),
  - a first reconciliation: every object is new, the catalog gains --objects rows ("first"),
  - a second one in the same agent: every object is already known, nothing to write ("steady").

Prints the medians, the ratios s5cmd time / Strata time (>= 1 means Strata is at least as fast), the split of
Strata's time into listing and catalog update (`list_secs` / `apply_secs` of the JSON), CPU seconds of the
origin per phase, the agent's peak RSS, and checks that object counts and byte totals agree.

    python3 bench/reconcile_vs_s5cmd.py [--objects 100000] [--prefixes 100] [--object-bytes 1024] [--rounds 3]

Needs .venv (scripts/test.sh makes it) and a release build (cargo build --release -p strata-cli). Raw JSON
lands in bench/out/reconcile_vs_s5cmd.json.
"""
import argparse
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
STRATA = os.path.join(ROOT, "target", "release", "strata")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import cpu_seconds, free_port, peak_rss_mib, start_serve, wait_port  # noqa: E402

AK, SK = "benchkey", "bench-secret-key"
TOKEN = "bench-admin-token-0123456789"
BUCKET = "bench"


def s5(endpoint, *args, workers=None, capture=False):
    """Run s5cmd against `endpoint`; return (wall seconds, stdout)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_REGION="us-east-1")
    cmd = [os.path.join(VENV, "s5cmd"), "--endpoint-url", endpoint]
    if workers:
        cmd += ["--numworkers", str(workers)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd + list(args), env=env, check=True, text=True,
                       stdout=subprocess.PIPE if capture else subprocess.DEVNULL)
    return time.perf_counter() - t0, p.stdout


def s5_du(endpoint):
    """`s5cmd --json du "s3://bench/*"`: (wall seconds, objects, bytes)."""
    wall, out = s5(endpoint, "--json", "du", f"s3://{BUCKET}/*", capture=True)
    line = json.loads(out.strip().splitlines()[-1])
    return wall, int(line["count"]), int(line["size"])


def populate(endpoint, work, objects, prefixes, size, workers):
    src = os.path.join(work, "src")
    t0 = time.perf_counter()
    payload = os.urandom(size)
    for i in range(objects):
        d = os.path.join(src, f"p{i % prefixes:03}")
        if i < prefixes:
            os.makedirs(d)
        with open(os.path.join(d, f"obj-{i:07}.bin"), "wb") as f:
            f.write(payload)
    t_local = time.perf_counter() - t0
    s5(endpoint, "mb", f"s3://{BUCKET}")
    t_upload, _ = s5(endpoint, "cp", src + "/*", f"s3://{BUCKET}/", workers=workers)
    shutil.rmtree(src)
    return t_local, t_upload


class Agent:
    """`strata serve` with the bucket as backend `origin` and a fresh data directory (so an empty catalog)."""

    def __init__(self, work, endpoint, rnd):
        self.data = os.path.join(work, f"agent-{rnd}")
        cfg = os.path.join(work, "strata.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[[backends]]
name = "origin"
url = "s3://{BUCKET}"
[backends.options]
endpoint = "{endpoint}"
region = "us-east-1"
access_key_id = "{AK}"
secret_access_key = "{SK}"
""")
        self.env = dict(os.environ, STRATA_ADMIN_TOKEN=TOKEN, STRATA_TOKEN=TOKEN, STRATA_LOG="warn")
        self.proc, self.api = start_serve(cfg, self.data, env=self.env)

    def reconcile(self):
        """`strata usage reconcile origin --json`: (wall seconds of the CLI call, its JSON)."""
        t0 = time.perf_counter()
        p = subprocess.run([STRATA, "usage", "reconcile", "origin", "--json", "--api", self.api],
                           env=self.env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"strata usage reconcile failed ({p.returncode}): {p.stderr.strip()}")
        return wall, json.loads(p.stdout)

    def stop(self):
        rss, cpu = peak_rss_mib(self.proc.pid), cpu_seconds(self.proc.pid)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)
        return rss, cpu


def med(v):
    return statistics.median(v) if v else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--prefixes", type=int, default=100)
    ap.add_argument("--object-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--upload-workers", type=int, default=64)
    a = ap.parse_args()
    if not os.path.exists(STRATA):
        sys.exit("build first: cargo build --release -p strata-cli")
    work = tempfile.mkdtemp(prefix="strata-recbench-")
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        print(f"populating {a.objects} objects x {a.object_bytes} B in {a.prefixes} prefixes on moto at "
              f"{endpoint} ...", flush=True)
        t_local, t_upload = populate(endpoint, work, a.objects, a.prefixes, a.object_bytes, a.upload_workers)
        print(f"setup (not timed): local files {t_local:.1f} s, s5cmd cp upload {t_upload:.1f} s "
              f"({a.objects / t_upload:.0f} objects/s)", flush=True)
        expect_bytes = a.objects * a.object_bytes

        rows = {"s5cmd": [], "first": [], "steady": []}
        origin_cpu = {"s5cmd": [], "first": [], "steady": []}
        rss, agent_cpu, agree = [], [], True
        for r in range(a.rounds):
            agent = Agent(work, endpoint, r)
            order = ["s5cmd", "first", "steady"] if r % 2 == 0 else ["first", "steady", "s5cmd"]
            for phase in order:
                c0 = cpu_seconds(moto.pid)
                if phase == "s5cmd":
                    wall, count, size = s5_du(endpoint)
                    rows["s5cmd"].append({"wall_s": wall, "objects": count, "bytes": size})
                    ok = count == a.objects and size == expect_bytes
                else:
                    wall, v = agent.reconcile()
                    rows[phase].append({"wall_s": wall, **{k: v.get(k) for k in (
                        "listed", "listed_bytes", "added", "updated", "removed", "list_secs", "apply_secs")}})
                    changes = (v["added"], v["updated"], v["removed"])
                    want = (a.objects, 0, 0) if phase == "first" else (0, 0, 0)
                    ok = v["listed"] == a.objects and v["listed_bytes"] == expect_bytes and changes == want
                    if not ok:
                        print(f"  unexpected {phase} reconciliation: {v}")
                origin_cpu[phase].append(cpu_seconds(moto.pid) - c0)
                agree &= ok
            peak, cpu = agent.stop()
            rss.append(peak)
            agent_cpu.append(cpu)
            s, f, st = rows["s5cmd"][-1], rows["first"][-1], rows["steady"][-1]
            print(f"round {r + 1}: s5cmd du {s['wall_s']:.2f} s ({s['objects']} objects, {s['bytes']} B); "
                  f"strata first {f['wall_s']:.2f} s (list {f['list_secs']:.2f} + apply {f['apply_secs']:.2f}), "
                  f"steady {st['wall_s']:.2f} s (list {st['list_secs']:.2f} + apply {st['apply_secs']:.2f}); "
                  f"origin CPU {origin_cpu['s5cmd'][-1]:.1f} / {origin_cpu['first'][-1]:.1f} / "
                  f"{origin_cpu['steady'][-1]:.1f} s; agent peak RSS {peak:.0f} MiB", flush=True)

        m = {k: med([x["wall_s"] for x in v]) for k, v in rows.items()}
        split = {k: {"list_s": med([x["list_secs"] for x in rows[k]]),
                     "apply_s": med([x["apply_secs"] for x in rows[k]])} for k in ("first", "steady")}
        result = {
            "objects": a.objects, "prefixes": a.prefixes, "object_bytes": a.object_bytes, "rounds": a.rounds,
            "cpus": os.cpu_count(), "setup_local_s": round(t_local, 2), "setup_upload_s": round(t_upload, 2),
            "median_wall_s": {k: round(v, 3) for k, v in m.items()},
            "median_strata_split_s": {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in split.items()},
            "ratio_s5cmd_over_strata_first": round(m["s5cmd"] / m["first"], 3),
            "ratio_s5cmd_over_strata_steady": round(m["s5cmd"] / m["steady"], 3),
            "ratio_s5cmd_over_strata_list_only": round(m["s5cmd"] / split["steady"]["list_s"], 3),
            "median_origin_cpu_s": {k: round(med(v), 2) for k, v in origin_cpu.items()},
            "agent_peak_rss_mib_max": round(max(rss)), "agent_cpu_s_per_round": [round(c, 2) for c in agent_cpu],
            "counts_agree": agree, "rounds_detail": rows,
        }
        print(f"\nmedian wall: s5cmd du {m['s5cmd']:.2f} s; strata reconcile first {m['first']:.2f} s "
              f"(list {split['first']['list_s']:.2f} + apply {split['first']['apply_s']:.2f}), steady "
              f"{m['steady']:.2f} s (list {split['steady']['list_s']:.2f} + apply {split['steady']['apply_s']:.2f})")
        print(f"ratio s5cmd / strata: first {result['ratio_s5cmd_over_strata_first']:.2f}x, steady "
              f"{result['ratio_s5cmd_over_strata_steady']:.2f}x (listing alone "
              f"{result['ratio_s5cmd_over_strata_list_only']:.2f}x)")
        print(f"origin CPU per phase (median): {result['median_origin_cpu_s']}; agent peak RSS {max(rss):.0f} MiB")
        print(f"object counts and byte totals: {'agree' if agree else 'DISAGREE'} "
              f"({a.objects} objects, {expect_bytes} bytes expected)")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        with open(os.path.join(ROOT, "bench", "out", "reconcile_vs_s5cmd.json"), "w") as f:
            json.dump(result, f, indent=2)
        if not agree:
            sys.exit("counts or totals disagree")
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
