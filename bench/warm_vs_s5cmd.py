#!/usr/bin/env python3
"""`strata cache warm` (or a claim's staging, `--via claim`) vs `s5cmd cp` of the same prefix from the same S3
server, side by side in one run.

Both fetch every byte of a prefix from a real S3-protocol server (moto, on loopback) and write it to local
disk: s5cmd as files, Strata as checksummed cache blocks. Rounds alternate the order; the script prints the
median time of each, their throughput ratio (target: Strata >= 0.9x s5cmd), and the peak RSS of `strata serve`
against its bound (RAM tier + in-flight budget + 100 MiB).

    python3 bench/warm_vs_s5cmd.py [--total-mib 2048] [--object-mib 64] [--rounds 3] [--via warm|claim]
        [--s5cmd-part-mib 64] [--split-cpus]

With `--via claim`, Strata's side is a claim of the prefix submitted with `strata claim submit --wait`: admission
(listing, versions pinned), staging, and the counted `ready` verdict, timed from submission to ready (target:
>= 1x s5cmd).

Needs .venv (scripts/test.sh makes it) and a release build (cargo build --release -p strata-cli).
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
# STRATA_BENCH_BIN: another build of `strata` to measure (an A/B of two commits in one sitting).
STRATA = os.environ.get("STRATA_BENCH_BIN") or os.path.join(ROOT, "target", "release", "strata")
RAM_MIB, INFLIGHT_MIB = 256, 256
ORIGIN_PIN, CLIENT_PIN = [], []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listening on {port}")


def s5cmd(endpoint, *args):
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    return subprocess.run(CLIENT_PIN + [os.path.join(VENV, "s5cmd"), "--endpoint-url", endpoint, *args],
                          env=env, check=True, stdout=subprocess.DEVNULL)


def settle():
    """Start each phase from the same memory state: flush dirty pages and drop the page cache (root only).
    On a VM, writing into a page cache that must first reclaim memory costs several times more CPU than
    writing into free memory, which would otherwise favour whichever tool runs after a deletion."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def cpu_seconds(pid):
    """User + system CPU seconds of a process (and its reaped children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in fields[11:15]) / tick


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def start_serve(cfg, data_dir, env=None, addr="api.addr", prefix=()):
    """`strata serve` (release build) on loopback ports; returns (process, the address written to `addr` in the
    data dir: "api.addr" or "s3.addr")."""
    env = env if env is not None else dict(os.environ, STRATA_LOG="warn")
    proc = subprocess.Popen(list(prefix) + [STRATA, "serve", "--config", cfg, "--data-dir", data_dir, "--api-listen",
                                            "127.0.0.1:0", "--s3-listen", "127.0.0.1:0"],
                            stderr=subprocess.DEVNULL, env=env)
    addr_file = os.path.join(data_dir, addr)
    deadline = time.time() + 30
    while not (os.path.exists(addr_file) and open(addr_file).read().strip()):
        if time.time() > deadline or proc.poll() is not None:
            sys.exit("strata serve did not start")
        time.sleep(0.05)
    return proc, open(addr_file).read().strip()


def block_buffers(api, token):
    """The agent's block-buffer pool counters (`reused`, `allocated`, `released`): how often a block buffer was
    faulted in afresh instead of reused."""
    base = api if api.startswith("http") else f"http://{api}"
    req = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'^strata_cache_block_buffers_total\{event="(\w+)"\} (\S+)$', text, re.M)}


def run_strata(endpoint, work, rnd, via="warm"):
    data_dir = os.path.join(work, f"strata-{rnd}")
    cfg = os.path.join(work, "strata.toml")
    with open(cfg, "w") as f:
        f.write(f"""
[cache]
ram_capacity = "{RAM_MIB}MiB"
disk_capacity = "8GiB"
inflight_budget = "{INFLIGHT_MIB}MiB"

[[backends]]
name = "origin"
url = "s3://bench"
[backends.options]
endpoint = "{endpoint}"
access_key_id = "bench"
secret_access_key = "bench"
""")
    serve, api = start_serve(cfg, data_dir, prefix=CLIENT_PIN)
    t0 = time.perf_counter()
    token = open(os.path.join(data_dir, "admin-token")).read().strip()
    env = dict(os.environ, STRATA_TOKEN=token)
    if via == "claim":
        subprocess.run([STRATA, "team", "create", "bench", "--api", api], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        claim = os.path.join(work, "claim.yaml")
        with open(claim, "w") as f:
            f.write("version: 1\nteam: bench\ndatasets:\n  - {name: data, location: origin/data/}\n")
        t0 = time.perf_counter()
        out = subprocess.run([STRATA, "claim", "submit", claim, "--job", f"bench-{rnd}", "--wait", "--json",
                              "--api", api], capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
        if out.returncode != 0:
            sys.exit(f"strata claim submit failed ({out.returncode}): {out.stderr}")
        p = json.loads(out.stdout)["progress"]
        assert p["blocks_held"] == p["blocks_total"], p
        summary = {"done_bytes": p["bytes_done"], "failed_blocks": p["blocks_total"] - p["blocks_held"]}
    else:
        out = subprocess.run([STRATA, "cache", "warm", "origin/data/", "--quiet", "--concurrency", "16", "--api",
                              api], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"strata cache warm failed ({out.returncode}): {out.stderr}")
        dt = time.perf_counter() - t0
        summary = json.loads(out.stdout)
    rss = peak_rss_mib(serve.pid)
    cpu = cpu_seconds(serve.pid)
    summary["buffers"] = block_buffers(api, token)
    serve.terminate()
    serve.wait(timeout=30)
    shutil.rmtree(data_dir, ignore_errors=True)
    return dt, summary, rss, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total-mib", type=int, default=2048)
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--split-cpus", action="store_true",
                    help="run the origin on CPU 1 and the client under test on CPU 0 (taskset), so the origin "
                         "stands in for a separate machine instead of competing for the client's cores")
    ap.add_argument("--via", choices=["warm", "claim"], default="warm",
                    help="Strata's side: `strata cache warm`, or a claim's staging (submit to ready)")
    ap.add_argument("--s5cmd-part-mib", type=int, default=None,
                    help="s5cmd's part size (`cp -p`, default 50 MiB); the object size makes it one request per "
                         "object, as Strata's warm-up asks: the baseline at its best on an origin that reads a "
                         "whole object for each range request (moto)")
    a = ap.parse_args()
    if not os.path.exists(STRATA):
        sys.exit("build first: cargo build --release -p strata-cli")
    work = tempfile.mkdtemp(prefix="strata-bench-")
    port = free_port()
    global ORIGIN_PIN, CLIENT_PIN
    if a.split_cpus:
        ORIGIN_PIN, CLIENT_PIN = ["taskset", "-c", "1"], ["taskset", "-c", "0"]
    moto = subprocess.Popen(ORIGIN_PIN + [os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        s5cmd(endpoint, "mb", "s3://bench")
        src = os.path.join(work, "src")
        os.makedirs(src)
        n = a.total_mib // a.object_mib
        for i in range(n):
            with open(os.path.join(src, f"obj-{i:04}.bin"), "wb") as f:
                f.write(os.urandom(a.object_mib << 20))
        s5cmd(endpoint, "cp", src + "/*", "s3://bench/data/")
        shutil.rmtree(src)
        total = n * a.object_mib
        print(f"cpus: {'origin on cpu 1, client on cpu 0' if a.split_cpus else 'shared (origin and client compete)'}")
        print(f"data set: {n} objects x {a.object_mib} MiB = {total} MiB on moto at {endpoint}")
        s5_times, st_times, rss, cpu = [], [], [], {"s5cmd": [], "strata": [], "moto_s5cmd": [], "moto_strata": []}
        for r in range(a.rounds):
            order = ["s5cmd", "strata"] if r % 2 == 0 else ["strata", "s5cmd"]
            for who in order:
                dropped = settle()
                moto_cpu0 = cpu_seconds(moto.pid)
                if who == "s5cmd":
                    dst = os.path.join(work, "s5cmd-out")
                    shutil.rmtree(dst, ignore_errors=True)
                    t0 = time.perf_counter()
                    t_cpu = os.times()
                    part = ["-p", str(a.s5cmd_part_mib)] if a.s5cmd_part_mib else []
                    s5cmd(endpoint, "cp", *part, "s3://bench/data/*", dst + "/")
                    s5_times.append(time.perf_counter() - t0)
                    t_cpu2 = os.times()
                    cpu["s5cmd"].append((t_cpu2.children_user - t_cpu.children_user) + (t_cpu2.children_system - t_cpu.children_system))
                    shutil.rmtree(dst, ignore_errors=True)
                else:
                    dt, summary, peak, serve_cpu = run_strata(endpoint, work, r, a.via)
                    cpu["strata"].append(serve_cpu)
                    assert summary["done_bytes"] == total << 20 and summary["failed_blocks"] == 0, summary
                    st_times.append(dt)
                    rss.append(peak)
                    buffers = summary["buffers"]
                cpu["moto_" + who].append(cpu_seconds(moto.pid) - moto_cpu0)
            print(f"round {r + 1}: s5cmd {s5_times[-1]:.2f} s (cpu {cpu['s5cmd'][-1]:.1f} s, origin cpu "
                  f"{cpu['moto_s5cmd'][-1]:.1f} s), strata {a.via} {st_times[-1]:.2f} s (cpu {cpu['strata'][-1]:.1f} s, "
                  f"origin cpu {cpu['moto_strata'][-1]:.1f} s), strata peak RSS {rss[-1]:.0f} MiB, block buffers {buffers}")
        ms, mt = statistics.median(s5_times), statistics.median(st_times)
        bound = RAM_MIB + INFLIGHT_MIB + 100
        result = {
            "via": a.via, "s5cmd_part_mib": a.s5cmd_part_mib, "split_cpus": a.split_cpus, "total_mib": total, "object_mib": a.object_mib, "rounds": a.rounds,
            "s5cmd_median_s": round(ms, 3), "strata_median_s": round(mt, 3),
            "s5cmd_mib_s": round(total / ms, 1), "strata_mib_s": round(total / mt, 1),
            "ratio_strata_over_s5cmd": round(ms / mt, 3),
            "strata_peak_rss_mib_max": round(max(rss)), "rss_bound_mib": bound,
            "cpu_s_median": {k: round(statistics.median(v), 2) for k, v in cpu.items()},
        }
        print(f"page cache dropped before each phase: {dropped}")
        print(f"\nmedian: s5cmd {ms:.2f} s ({total / ms:.0f} MiB/s), strata {a.via} {mt:.2f} s ({total / mt:.0f} MiB/s)")
        print(f"ratio strata ({a.via})/s5cmd throughput = {ms / mt:.2f}x (target >= "
              f"{'1.0' if a.via == 'claim' else '0.9'}x)")
        print(f"strata serve peak RSS {max(rss):.0f} MiB; bound RAM tier {RAM_MIB} + in-flight {INFLIGHT_MIB} + 100 = {bound} MiB"
              f" -> {'within' if max(rss) <= bound else 'OVER'}")
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        name = f"{a.via}_vs_s5cmd{'_split' if a.split_cpus else ''}{f'_p{a.s5cmd_part_mib}' if a.s5cmd_part_mib else ''}.json"
        with open(os.path.join(ROOT, "bench", "out", name), "w") as f:
            json.dump(result, f, indent=2)
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
