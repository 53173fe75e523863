#!/usr/bin/env python3
"""Strata's parallel usage scan vs `du -s -B1` over the same directory tree, side by side in one run.

Generates (once, cached under --tree) a tree of --files small files (0-4 KiB) in 10 top-level projects of
many directories, warms the page, dentry and inode caches with one untimed `du`, then runs `du -s -B1 TREE`
and the Strata scanner for --rounds interleaved rounds (the order alternates), each in its own subprocess.
Prints the median wall time of each, the ratio du / Strata (>= 1 means Strata is at least as fast), CPU
seconds, the peak RSS of each (per child, through /usr/bin/time), and checks that the allocated byte totals
agree exactly.

    python3 bench/usage_scan_vs_du.py [--files 1000000] [--tree /tmp/strata-bench-tree] [--rounds 3]
                                      [--threads 0] [--remove]

The Strata side is `target/release/strata usage scan TREE --json` (the CLI scans locally, no agent); the
script builds it once with `cargo build --release -p strata-cli` (skip with --no-build). Needs about one inode
and one 4 KiB block per file (check `df -i` first). Raw JSON lands in bench/out/usage_scan_vs_du.json.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_CMD = ["cargo", "build", "--release", "-p", "strata-cli"]
# The Strata side, in one place: the operator CLI's local scan (prints the ScanReport as JSON).
STRATA_SCAN = [os.path.join(ROOT, "target", "release", "strata"), "usage", "scan"]
PROJECTS = 10
FILES_PER_DIR = 100
DIRS_PER_GROUP = 50
MARKER = ".strata-bench-tree.json"
TIME = "/usr/bin/time"  # GNU time, for a per-child peak RSS


def generate(tree, files):
    """Create the tree unless a complete one with the same parameters is already there."""
    params = {"files": files, "projects": PROJECTS, "files_per_dir": FILES_PER_DIR, "version": 1}
    marker = os.path.join(tree, MARKER)
    try:
        with open(marker) as f:
            if json.load(f) == params:
                print(f"using the cached tree at {tree} ({files} files)")
                return
    except (OSError, ValueError):
        pass
    if os.path.exists(tree):
        print(f"removing the stale tree at {tree}")
        shutil.rmtree(tree)
    print(f"generating {files} files under {tree} ...", flush=True)
    started = time.perf_counter()
    rng = random.Random(20240601)
    payload = os.urandom(4096)
    dirs = (files + FILES_PER_DIR - 1) // FILES_PER_DIR
    made = 0
    for d in range(dirs):
        # Round-robin over the projects; within a project, groups of DIRS_PER_GROUP directories.
        project, index = d % PROJECTS, d // PROJECTS
        path = os.path.join(tree, f"project{project:02}", f"g{index // DIRS_PER_GROUP:04}", f"d{index:05}")
        os.makedirs(path, exist_ok=True)
        for i in range(min(FILES_PER_DIR, files - made)):
            fd = os.open(os.path.join(path, f"f{i:03}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, payload[:rng.randint(0, 4096)])
            os.close(fd)
            made += 1
    with open(marker, "w") as f:
        json.dump(params, f)
    print(f"generated {made} files in {dirs} directories in {time.perf_counter() - started:.1f} s", flush=True)


def run(cmd):
    """Run `cmd`; return (wall seconds, CPU seconds, peak RSS in KiB, stdout) for that child alone.

    The peak RSS comes from /usr/bin/time when there is one: a child forked from this Python process inherits
    its high-water mark across exec (Linux keeps the larger of the two in ru_maxrss), so wait4's figure would
    be at least this interpreter's own RSS."""
    timed = os.path.exists(TIME)
    rss_file = os.path.join(tempfile.gettempdir(), f"strata-bench-rss-{os.getpid()}")
    full = [TIME, "-f", "%M", "-o", rss_file] + cmd if timed else cmd
    started = time.perf_counter()
    proc = subprocess.Popen(full, stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} exited with {proc.returncode}")
    rss = usage.ru_maxrss
    if timed:
        with open(rss_file) as f:
            rss = int(f.read().split()[-1])
        os.unlink(rss_file)
    return wall, usage.ru_utime + usage.ru_stime, rss, out.decode()


def du(tree):
    wall, cpu, rss, out = run(["du", "-s", "-B1", tree])
    return wall, cpu, rss, int(out.split()[0])


def strata(tree, threads):
    wall, cpu, rss, out = run(STRATA_SCAN + [tree, "--threads", str(threads), "--json"])
    report = json.loads(out)
    if report["errors_total"]:
        print(f"strata reported {report['errors_total']} errors, first: {report['errors'][:3]}")
    return wall, cpu, rss, report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--tree", default="/tmp/strata-bench-tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="scanner threads (0 = all cores)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--remove", action="store_true", help="delete the tree afterwards")
    args = ap.parse_args()

    if not args.no_build:
        subprocess.run(BUILD_CMD, cwd=ROOT, check=True)
    generate(args.tree, args.files)

    du(args.tree)  # untimed warm-up: both tools then start from the same warm caches
    results = {"du": [], "strata": []}
    du_bytes = report = None
    for r in range(args.rounds):
        order = ["du", "strata"] if r % 2 == 0 else ["strata", "du"]
        for tool in order:
            if tool == "du":
                wall, cpu, rss, du_bytes = du(args.tree)
            else:
                wall, cpu, rss, report = strata(args.tree, args.threads)
            results[tool].append({"wall_s": wall, "cpu_s": cpu, "max_rss_kib": rss})
            print(f"round {r + 1} {tool:>6}: {wall:7.3f} s wall, {cpu:7.3f} s CPU, {rss / 1024:7.1f} MiB peak RSS",
                  flush=True)

    med = {t: statistics.median(x["wall_s"] for x in v) for t, v in results.items()}
    cpu = {t: statistics.median(x["cpu_s"] for x in v) for t, v in results.items()}
    rss = {t: max(x["max_rss_kib"] for x in v) for t, v in results.items()}
    total = report["total"]
    agree = total["bytes"] == du_bytes
    summary = {
        "files": args.files, "tree": args.tree, "rounds": args.rounds, "threads": args.threads,
        "cpus": os.cpu_count(), "scanned": total, "du_bytes": du_bytes, "bytes_agree": agree,
        "median_wall_s": med, "median_cpu_s": cpu, "peak_rss_kib": rss,
        "ratio_du_over_strata": med["du"] / med["strata"], "rounds_detail": results,
    }
    print(f"\n{total['files']} files, {total['dirs']} dirs, {total['bytes']} bytes allocated "
          f"(du: {du_bytes}) -> {'agree' if agree else 'DISAGREE'}")
    print(f"median wall: du {med['du']:.3f} s, strata {med['strata']:.3f} s; "
          f"ratio du/strata = {summary['ratio_du_over_strata']:.2f}x")
    print(f"median CPU:  du {cpu['du']:.3f} s, strata {cpu['strata']:.3f} s")
    print(f"peak RSS:    du {rss['du'] / 1024:.1f} MiB, strata {rss['strata'] / 1024:.1f} MiB")

    out_dir = os.path.join(ROOT, "bench", "out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "usage_scan_vs_du.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.remove:
        shutil.rmtree(args.tree)
    if not agree:
        sys.exit("byte totals disagree")


if __name__ == "__main__":
    main()
