#!/usr/bin/env python3
"""Checkpoints side by side: strata.Checkpointer vs memcpy, torch.save, an fsync'd write and
torch.distributed.checkpoint, on the same state and the same disk, in one run.

A state of mixed tensor sizes (default 2 GiB: 8 x 128 MiB, 96 x 8 MiB, 256 x 1 MiB float32) is built in a fresh
process for each measurement, so peak RSS is per phase:

1. blocking time of save() (the caller's stall) vs copying the same tensors in memory (target <= 1.5x) and vs a
   synchronous torch.save to the same disk (target <= 0.1x);
2. time until the checkpoint is durable on the local tier (save + wait) vs writing the same bytes to one file with
   fsync (target >= 0.8x of its throughput);
3. restore from the local tier vs from the object store (moto on loopback; page cache dropped before each; target
   local >= 5x faster);
4. torch.distributed.checkpoint (async_save on CPU, gloo, one rank) as a reference row;
and the extra peak RSS of a save (target <= 1.1x the state + 128 MiB).

    .venv/bin/python bench/ckpt_vs_baselines.py [--gib 2] [--dir DIR]

Needs .venv with the strata wheel (scripts/test.sh; a release wheel for figures, see bench/README.md).
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")

CHILD = r"""
import json, os, sys, time
import torch

def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

gib, mode, d = float(sys.argv[1]), sys.argv[2], sys.argv[3]
remote = sys.argv[4] if len(sys.argv) > 4 else None
scale = gib / 2.0
sizes = [128 << 20] * 8 + [8 << 20] * 96 + [1 << 20] * 256
state, total = {}, 0
for i, b in enumerate(sizes):
    n = max(1, int(b * scale) // 4)
    t = torch.empty(n, dtype=torch.float32)
    t.copy_(torch.arange(n, dtype=torch.float32) + i)   # touch every page, deterministic content
    state[f"layer{i:03d}.weight"] = t
    total += n * 4
base_rss = vm("VmRSS:")
out = {"bytes": total}
if mode == "memcpy":
    t0 = time.perf_counter()
    copy = {k: v.clone() for k, v in state.items()}
    out["seconds"] = time.perf_counter() - t0
elif mode == "torch.save":
    t0 = time.perf_counter()
    torch.save(state, os.path.join(d, "ckpt.pt"))
    out["seconds"] = time.perf_counter() - t0
elif mode == "fsync-write":
    t0 = time.perf_counter()
    with open(os.path.join(d, "raw.bin"), "wb") as f:
        for v in state.values():
            f.write(v.numpy().data)
        f.flush()
        os.fsync(f.fileno())
    out["seconds"] = time.perf_counter() - t0
elif mode == "strata":
    import strata
    c = strata.Checkpointer("bench", d, remote, rank=0, world_size=1, keep_local=0)
    # The first save of a process pays page faults for its staging memory; later saves reuse it (steady state,
    # as in a training loop that saves every N steps).
    for step in (1, 2):
        t0 = time.perf_counter()
        h = c.save(step, state)
        blocking = time.perf_counter() - t0
        for v in state.values():
            v.add_(1.0)        # training goes on: the saved copy must not change
        assert h.wait() == "done", h.error
        key = "" if step == 2 else "first_"
        out[key + "blocking"] = blocking
        out[key + "seconds"] = time.perf_counter() - t0
    out["extra_rss"] = vm("VmHWM:") - base_rss
elif mode in ("restore-local", "restore-remote"):
    import strata
    c = strata.Checkpointer("bench", d, remote, rank=0, world_size=1)
    # As a trainer restores: load, then copy into the model's (existing) tensors, so lazily mapped bytes are
    # really read.
    t0 = time.perf_counter()
    step, st = c.load_latest()
    for k, v in st.items():
        state[k].copy_(v)
    out["seconds"] = time.perf_counter() - t0
    assert step == 2
elif mode == "read-cold":
    # The disk's ceiling for a cold restore: read the newest checkpoint's files once into one reused buffer.
    steps = sorted(p for p, _, _ in os.walk(d) if os.path.basename(p).startswith("step-"))
    buf = memoryview(bytearray(16 << 20))
    t0 = time.perf_counter()
    n = 0
    for name in os.listdir(steps[-1]):
        with open(os.path.join(steps[-1], name), "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
    out["seconds"] = time.perf_counter() - t0
    out["read_bytes"] = n
elif mode == "dcp":
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    dist.init_process_group("gloo", init_method=f"file://{d}/pg", rank=0, world_size=1)
    t0 = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=os.path.join(d, "dcp"))
    out["blocking"] = time.perf_counter() - t0
    fut.result()
    out["seconds"] = time.perf_counter() - t0
    out["extra_rss"] = vm("VmHWM:") - base_rss
    dist.destroy_process_group()
print(json.dumps(out))
"""


def drop_caches():
    try:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


SETTLE = 0.0


def run(gib, mode, d, remote=None, env=None, drop=True):
    if drop:
        drop_caches()
    # A virtual disk with burst credits writes the first GiBs after a pause faster than the next ones: give
    # every measurement the same pause, so the order of the phases does not pick the winner.
    time.sleep(SETTLE)
    args = [sys.executable, "-c", CHILD, str(gib), mode, d] + ([remote] if remote else [])
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--dir", default=None, help="local tier / disk under test (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds of idle before each measurement (disk burst credits refill)")
    args = ap.parse_args()
    global SETTLE
    SETTLE = args.settle
    base = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir)
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import boto3

        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                     region_name="us-east-1").create_bucket(Bucket="bench")
        env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s",
                   AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
        import statistics

        rounds = []
        for rnd in range(args.rounds):
            res = {}
            for mode in ("memcpy", "torch.save", "fsync-write", "dcp"):
                d = os.path.join(base, mode)
                os.makedirs(d)
                res[mode] = run(args.gib, mode, d)
                shutil.rmtree(d, ignore_errors=True)
            d = os.path.join(base, "strata")
            os.makedirs(d)
            res["strata"] = run(args.gib, "strata", d)
            shutil.rmtree(d)
            os.makedirs(d)
            res["strata+s3"] = run(args.gib, "strata", d, f"s3://bench/ckpt{rnd}", env)
            # Restarted on the same node: the files are still in the page cache; after a reboot they are not.
            res["restore-local"] = run(args.gib, "restore-local", d, f"s3://bench/ckpt{rnd}", env, drop=False)
            res["restore-local-cold"] = run(args.gib, "restore-local", d, f"s3://bench/ckpt{rnd}", env)
            res["read-cold"] = run(args.gib, "read-cold", d)
            shutil.rmtree(d)
            os.makedirs(d)
            res["restore-remote"] = run(args.gib, "restore-remote", d, f"s3://bench/ckpt{rnd}", env)
            shutil.rmtree(d)
            rounds.append(res)
            print(f"round {rnd}: {json.dumps(res)}", flush=True)

        def med(mode, key):
            vals = [r[mode][key] for r in rounds if r.get(mode) and key in r[mode]]
            return statistics.median(vals) if vals else float("nan")

        keys = ("seconds", "blocking", "first_seconds", "first_blocking", "extra_rss", "bytes")
        res = {m: {k: med(m, k) for k in keys} for m in rounds[0]}
        gib = res["memcpy"]["bytes"] / 2**30
        s, m = res["strata"], res["memcpy"]
        print(f"\nstate {gib:.2f} GiB, local tier {base}, medians of {args.rounds} rounds")
        print(f"(1) save() blocking {s['blocking']:.3f} s (first save of the process {s['first_blocking']:.3f} s); "
              f"memcpy {m['seconds']:.3f} s -> {s['blocking'] / m['seconds']:.2f}x "
              f"({s['first_blocking'] / m['seconds']:.2f}x) (target <= 1.5x); torch.save "
              f"{res['torch.save']['seconds']:.2f} s -> {s['blocking'] / res['torch.save']['seconds']:.3f}x "
              f"({s['first_blocking'] / res['torch.save']['seconds']:.3f}x) (target <= 0.1x)")
        f = res["fsync-write"]
        print(f"(2) durable on the local tier {s['seconds']:.2f} s (first save {s['first_seconds']:.2f} s) vs fsync'd "
              f"write {f['seconds']:.2f} s -> {f['seconds'] / s['seconds']:.2f}x its throughput "
              f"({f['seconds'] / s['first_seconds']:.2f}x) (target >= 0.8x)")
        rl, rc, rr = res["restore-local"], res["restore-local-cold"], res["restore-remote"]
        print(f"(3) restore local {rl['seconds']:.2f} s (page cache dropped: {rc['seconds']:.2f} s) vs object store "
              f"{rr['seconds']:.2f} s -> {rr['seconds'] / rl['seconds']:.1f}x ({rr['seconds'] / rc['seconds']:.1f}x "
              f"cold) (target >= 5x); reading the same files cold takes {res['read-cold']['seconds']:.2f} s (the "
              "disk's ceiling)")
        if res.get("dcp"):
            dcp = res["dcp"]
            print(f"(4) torch.distributed.checkpoint async_save: blocking {dcp['blocking']:.3f} s, durable "
                  f"{dcp['seconds']:.2f} s, extra RSS {dcp['extra_rss'] / 2**20:.0f} MiB")
        print(f"extra peak RSS of a save: {s['extra_rss'] / 2**20:.0f} MiB = "
              f"{s['extra_rss'] / res['memcpy']['bytes']:.2f}x the state (target <= 1.1x + 128 MiB); with the "
              f"object store tier {res['strata+s3']['extra_rss'] / 2**20:.0f} MiB, durable in "
              f"{res['strata+s3']['seconds']:.2f} s")
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
