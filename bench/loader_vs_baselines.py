#!/usr/bin/env python3
"""Streaming loaders side by side: Strata vs mosaicml-streaming vs webdataset, same shards, same S3 server.

One run writes two datasets (about 100 KiB samples and about 4 MiB samples) in both formats with the real
webdataset and mosaicml-streaming writers, uploads them to one moto S3 server on loopback, and reads every
dataset for two epochs (1: cold, 2: warm) through a torch DataLoader with the same number of workers and batch
size, shuffled, each loader caching on local disk:

- Strata on the WebDataset tars and on the MDS shards (in-process cache), also with ``zero_copy=True``
  (``-zc``: binary fields as ``strata.Buffer`` instead of a copy into ``bytes``) and through a node agent;
- mosaicml-streaming on the MDS shards (downloads shards to its local dir);
- webdataset on the tars (presigned HTTP URLs through curl, with its shard cache_dir);
- litdata, when installed (`pip install litdata`; it is not part of the test tools), on the same samples
  written in its own chunk format by its `optimize` (same count and sizes, 64 MiB / 32 MiB chunks), through
  boto3 (its obstore path refuses plain-HTTP endpoints: uninstall obstore to bench against moto).

It prints samples/s per cell, Strata's ratio to the best baseline (target 1.5x), time to first sample, peak RSS
of the training process (and what the data added: the peak minus the RSS with torch and the loader imported)
and of its largest worker, and Strata's resume time at 10% and 90% of an epoch of a
1M-sample index (target <= 1 s, independent of the position).

    .venv/bin/python bench/loader_vs_baselines.py [--small 3000] [--large 100] [--workers 2] [--rounds 3]
        [--resume-samples 1000000] [--only strata-wds,strata-mds,mosaic,webdataset,...]

Needs .venv with the strata wheel installed (scripts/test.sh does both; for figures build it with
`maturin build --release -m python/Cargo.toml` and install that wheel).
"""
import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
KEY, SECRET = "bench", "bench-secret"
BUCKET = "bench"
AGENT_TOKEN = "bench-agent-token-0123456789"  # the agent's API needs a bearer token


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


def s3_env(endpoint):
    return dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
                AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint, S3_ENDPOINT_URL=endpoint,
                AWS_ALLOW_HTTP="true")


# --------------------------------------------------------------------------------------------------------------
# Data


def write_datasets(out, n, sample_bytes, shard_bytes, seed):
    import numpy as np
    import webdataset as wds
    from streaming import MDSWriter

    rng = np.random.default_rng(seed)
    wdir, mdir = os.path.join(out, "wds"), os.path.join(out, "mds")
    os.makedirs(wdir)
    payloads = (rng.integers(0, 256, sample_bytes, dtype=np.uint8).tobytes() for _ in range(n))
    with wds.ShardWriter(os.path.join(wdir, "shard-%05d.tar"), maxsize=shard_bytes, maxcount=10**9,
                         verbose=0) as sink, \
            MDSWriter(out=mdir, columns={"bin": "bytes", "cls": "int"}, size_limit=shard_bytes) as mds:
        for i, p in enumerate(payloads):
            sink.write({"__key__": f"s{i:08d}", "bin": p, "cls": str(i % 1000).encode()})
            mds.write({"bin": p, "cls": i % 1000})
    return wdir, mdir


def litdata_sample(args):
    """One sample of the litdata copy: the same sizes as the others (its bytes drawn per index)."""
    import numpy as np

    i, size, seed = args
    p = np.random.default_rng((seed, i)).integers(0, 256, size, dtype=np.uint8).tobytes()
    return {"bin": p, "cls": i % 1000}


def write_litdata(out, n, sample_bytes, shard_bytes, seed):
    """The same samples in litdata's chunk format (its `optimize`), or None when litdata is not installed."""
    try:
        from litdata import optimize
    except ImportError:
        return None
    d = os.path.join(out, "litdata")
    optimize(fn=litdata_sample, inputs=[(i, sample_bytes, seed) for i in range(n)], output_dir=d,
             chunk_bytes=shard_bytes, num_workers=1, verbose=False, start_method="fork")
    return d


def upload(s3, d, prefix):
    for f in sorted(os.listdir(d)):
        s3.upload_file(os.path.join(d, f), BUCKET, f"{prefix}/{f}")


# --------------------------------------------------------------------------------------------------------------
# One loader in a child process: python loader_vs_baselines.py --run KIND URL ...


TOUCH = os.environ.get("STRATA_BENCH_TOUCH") == "1"


def run_one(kind, url, workers, batch, scratch, endpoint, prefix_keys):
    import torch
    from torch.utils.data import DataLoader

    # The process's RSS with torch and the loader's package imported, before any data: what a loader adds is
    # its peak minus this.
    if kind.startswith("strata"):
        import strata  # noqa: F401
    elif kind == "mosaic":
        import streaming  # noqa: F401
    elif kind == "litdata":
        import litdata  # noqa: F401
    else:
        import boto3  # noqa: F401
        import webdataset  # noqa: F401
    rss_base = vm_rss(os.getpid())
    t_start = time.perf_counter()
    if kind.startswith("strata"):
        import strata

        if "-agent" in kind:
            opts = dict(cache="agent", agent=os.environ["STRATA_AGENT"], prefetch_bytes=64 << 20)
        else:
            opts = dict(cache="local", prefetch_bytes=64 << 20)
        if kind.endswith("-zc"):  # binary fields as strata.Buffer (no copy into a bytes object)
            opts["zero_copy"] = True
        opts.update(json.loads(os.environ.get("STRATA_BENCH_OPTS", "{}")))
        ds = strata.StreamingDataset(url, shuffle=True, seed=0, batch_size=batch, **opts)
        set_epoch = ds.set_epoch
    elif kind == "litdata":
        import litdata

        # litdata hands out memoryviews over its chunks, which a DataLoader worker cannot pickle: bytes, as
        # its users must.
        ds = litdata.StreamingDataset(url, cache_dir=os.path.join(scratch, "litdata-cache"), shuffle=True,
                                      seed=0, storage_options={"endpoint_url": endpoint},
                                      transform=lambda s: {k: bytes(v) if isinstance(v, memoryview) else v
                                                           for k, v in s.items()})
        set_epoch = ds.set_epoch
    elif kind == "mosaic":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(remote=url, local=os.path.join(scratch, "mds-local"), shuffle=True, shuffle_seed=0,
                              batch_size=batch)
        set_epoch = lambda e: None  # it advances its epoch on each iteration
    elif kind == "webdataset":
        import boto3
        import webdataset as wds
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
        urls = [s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": k}, ExpiresIn=3600)
                for k in prefix_keys]
        shuffle_buf = 1000 if "small" in url else 32
        os.makedirs(os.path.join(scratch, "wds-cache"), exist_ok=True)
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node,
                             workersplitter=wds.split_by_worker, cache_dir=os.path.join(scratch, "wds-cache"),
                             empty_check=False)
              .shuffle(shuffle_buf))
        set_epoch = lambda e: None
    else:
        raise SystemExit(f"unknown loader {kind}")
    dl = DataLoader(ds, batch_size=batch, num_workers=workers, collate_fn=lambda b: b)
    import numpy as np

    epochs, first, worker_peak, touched = [], None, 0.0, 0
    for epoch in range(2):
        set_epoch(epoch)
        t0 = time.perf_counter()
        n = 0
        nbytes = 0
        it = iter(dl)
        for i, b in enumerate(it):
            if first is None:
                first = time.perf_counter() - t_start
            for s in b:
                nbytes += len(s["bin"])
                if TOUCH:  # read one byte of every page, as a consumer that decodes the sample must
                    touched += int(np.frombuffer(s["bin"], np.uint8)[::4096].sum())
            n += len(b)
            if i % 8 == 0:  # workers' peak RSS, sampled while they run
                for w in getattr(it, "_workers", []):
                    worker_peak = max(worker_peak, vm_hwm(w.pid))
        epochs.append({"samples": n, "seconds": time.perf_counter() - t0, "bytes": nbytes})
    print(json.dumps({"epochs": epochs, "first_sample_s": first, "rss_main_mib": vm_hwm(os.getpid()),
                      "rss_base_mib": rss_base,
                      "rss_worker_mib": worker_peak}))


def start_agent(endpoint, scratch):
    """`strata serve` (release build) fronting the bench bucket: the node agent the loader shares."""
    cfg = os.path.join(scratch, "strata.toml")
    with open(cfg, "w") as f:
        f.write(f"""
[cache]
ram_capacity = "1GiB"
disk_capacity = "8GiB"
[[backends]]
name = "bench"
url = "s3://{BUCKET}"
[backends.options]
endpoint = "{endpoint}"
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"
""" + os.environ.get("STRATA_BENCH_AGENT_EXTRA", "").replace(";", "\n"))
    # STRATA_BENCH_AGENT_EXTRA: more of the agent's configuration, `;` for newlines (an on/off A/B).
    data = os.path.join(scratch, "agent")
    # STRATA_BENCH_BIN: another build of `strata` (an A/B of two commits in one sitting, with their wheels).
    binary = os.environ.get("STRATA_BENCH_BIN") or os.path.join(ROOT, "target", "release", "strata")
    proc = subprocess.Popen([binary, "serve", "--config", cfg,
                             "--data-dir", data, "--api-listen", "127.0.0.1:0", "--s3-listen", "127.0.0.1:0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, STRATA_ADMIN_TOKEN=AGENT_TOKEN))
    addr = os.path.join(data, "api.addr")
    deadline = time.time() + 30
    while not (os.path.exists(addr) and open(addr).read().strip()):
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit("strata serve did not start")
        time.sleep(0.05)
    return proc, open(addr).read().strip()


def cpu_seconds(pid):
    """User + system CPU seconds of a live process."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


ORIGIN_PID = None


def child(kind, url, args, endpoint, keys):
    scratch = tempfile.mkdtemp(prefix=f"bench-{kind}-")
    agent = None
    env = s3_env(endpoint)
    if "-agent" in kind:
        agent, api = start_agent(endpoint, scratch)
        env["STRATA_AGENT"] = api
        env["STRATA_TOKEN"] = AGENT_TOKEN
    try:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:  # cold page cache for every contender (root)
            f.write("3\n")
    except OSError:
        pass
    cpu0 = cpu_seconds(ORIGIN_PID)
    try:
        try:
            r = subprocess.run([sys.executable, __file__, "--run", kind, url, "--workers", str(args.workers),
                                "--batch", str(args.batch), "--scratch", scratch, "--endpoint", endpoint,
                                "--keys", json.dumps(keys)],
                               env=env, capture_output=True, text=True, timeout=1200)
        except subprocess.TimeoutExpired as e:
            print(f"    {kind} timed out; left out of this round: {str(e.stderr)[-2000:]}", file=sys.stderr)
            return None
        if r.returncode != 0:
            print(r.stderr[-3000:], file=sys.stderr)
            print(f"    {kind} failed; left out of this round", file=sys.stderr)
            return None
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["origin_cpu_s"] = cpu_seconds(ORIGIN_PID) - cpu0
        if agent is not None:
            out["rss_agent_mib"] = vm_hwm(agent.pid)
        return out
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait()
        shutil.rmtree(scratch, ignore_errors=True)


def median_run(runs):
    """One cell's result from several rounds: the median of each figure (rates as samples over seconds)."""
    if len(runs) == 1:
        return runs[0]
    med = statistics.median
    epochs = []
    for i in range(len(runs[0]["epochs"])):
        rate = med(r["epochs"][i]["samples"] / r["epochs"][i]["seconds"] for r in runs)
        n = runs[0]["epochs"][i]["samples"]
        epochs.append({"samples": n, "seconds": n / rate, "bytes": runs[0]["epochs"][i]["bytes"]})
    out = {"epochs": epochs}
    for k in runs[0]:
        if k != "epochs":
            out[k] = med(r[k] for r in runs)
    return out


def proc_status_mib(pid, field):
    """A `VmRSS:` / `VmHWM:` line of a live process's /proc status, in MiB (0 when it is gone)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def vm_rss(pid):
    """Current RSS (MiB) of a live process."""
    return proc_status_mib(pid, "VmRSS:")


def vm_hwm(pid):
    """Peak RSS (MiB) of a live process, from /proc (getrusage would include a parent's peak across exec)."""
    return proc_status_mib(pid, "VmHWM:")


# --------------------------------------------------------------------------------------------------------------
# Resume time on a 1M-sample index


MOSAIC_RESUME_CHILD = r"""
import json, sys, time, shutil
from streaming import StreamingDataset
from streaming.base.util import clean_stale_shared_memory
clean_stale_shared_memory()
t0 = time.perf_counter()
ds = StreamingDataset(local=sys.argv[1], shuffle=True, shuffle_seed=1, batch_size=32)
ds.load_state_dict({"epoch": 0, "sample_in_epoch": int(sys.argv[2]), "num_canonical_nodes": 1,
                    "shuffle_seed": 1, "initial_physical_nodes": 1})
s = next(iter(ds))
print(json.dumps({"resume_s": time.perf_counter() - t0}))
"""

RESUME_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import strata
t_import = time.perf_counter() - t0
t0 = time.perf_counter()
ds = strata.StreamingDataset(sys.argv[1], shuffle=True, seed=1, world_size=8, rank=3, batch_size=32)
state = ds.state_dict()
state["sample_in_epoch"] = int(sys.argv[2])
ds.load_state_dict(state)
it = iter(ds)
s = next(it)
print(json.dumps({"resume_s": time.perf_counter() - t0, "key": s["__key__"]}))
"""


def resume_bench(n, out):
    from streaming import MDSWriter

    d = os.path.join(out, "resume-mds")
    with MDSWriter(out=d, columns={"x": "int"}, size_limit=1 << 20) as w:
        for i in range(n):
            w.write({"x": i})
    # Two copies: Strata from the MDS index.json, and from a Strata manifest (1M sample offsets in JSON).
    dm = os.path.join(out, "resume-manifest")
    shutil.copytree(d, dm)
    import strata

    strata.index_dataset(dm)
    res = {}
    for label, script, path in (("strata, index.json", RESUME_CHILD, d),
                                ("strata, manifest", RESUME_CHILD, dm),
                                ("mosaic", MOSAIC_RESUME_CHILD, d)):
        for frac in (0.1, 0.9):
            times = []
            for _ in range(3):
                r = subprocess.run([sys.executable, "-c", script, path, str(int(n * frac))], capture_output=True,
                                   text=True)
                if r.returncode != 0:
                    print(f"{label}: resume failed: {r.stderr[-500:]}", file=sys.stderr)
                    break
                times.append(json.loads(r.stdout.strip().splitlines()[-1])["resume_s"])
            if times:
                res[(label, frac)] = statistics.median(times)
    return res


# --------------------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", type=int, default=3000, help="samples of ~100 KiB")
    ap.add_argument("--large", type=int, default=100, help="samples of ~4 MiB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="runs of every cell; figures are medians")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--touch", action="store_true",
                    help="the training loop reads one byte of every page of each sample (default: len() only)")
    ap.add_argument("--resume-samples", type=int, default=1_000_000)
    ap.add_argument("--only", default="",
                    help="comma list of loaders to run (strata-wds,strata-mds,mosaic,webdataset,litdata,...)")
    ap.add_argument("--run", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)
    ap.add_argument("--scratch", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--keys", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.touch:
        os.environ["STRATA_BENCH_TOUCH"] = "1"
    if args.run:
        run_one(args.run[0], args.run[1], args.workers, args.batch, args.scratch, args.endpoint,
                json.loads(args.keys))
        return

    import boto3
    from botocore.config import Config

    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    global ORIGIN_PID
    ORIGIN_PID = moto.pid
    out = tempfile.mkdtemp(prefix="bench-loader-")
    try:
        wait_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        os.environ.update(s3_env(endpoint))
        import strata

        only = set(filter(None, args.only.split(",")))
        results = {}
        for name, n, size, shard in (("small", args.small, 100 << 10, 32 << 20),
                                     ("large", args.large, 4 << 20, 64 << 20)):
            if n <= 0:
                continue
            wdir, mdir = write_datasets(os.path.join(out, name), n, size, shard, seed=1)
            upload(s3, wdir, f"{name}/wds")
            upload(s3, mdir, f"{name}/mds")
            ldir = None if only and "litdata" not in only else write_litdata(os.path.join(out, name), n, size,
                                                                              shard, seed=1)
            if ldir:
                upload(s3, ldir, f"{name}/litdata")
            strata.index_dataset(f"s3://{BUCKET}/{name}/wds")
            tar_keys = [f"{name}/wds/{f}" for f in sorted(os.listdir(wdir))]
            shutil.rmtree(os.path.join(out, name))
            cells = [("strata-wds", f"s3://{BUCKET}/{name}/wds"), ("webdataset", f"s3://{BUCKET}/{name}/wds"),
                     ("strata-mds", f"s3://{BUCKET}/{name}/mds"), ("mosaic", f"s3://{BUCKET}/{name}/mds"),
                     *([("litdata", f"s3://{BUCKET}/{name}/litdata")] if ldir else []),
                     ("strata-wds-zc", f"s3://{BUCKET}/{name}/wds"), ("strata-mds-zc", f"s3://{BUCKET}/{name}/mds"),
                     ("strata-wds-agent", f"s3://{BUCKET}/{name}/wds"),
                     ("strata-mds-agent", f"s3://{BUCKET}/{name}/mds"),
                     ("strata-wds-agent-zc", f"s3://{BUCKET}/{name}/wds"),
                     ("strata-mds-agent-zc", f"s3://{BUCKET}/{name}/mds")]
            runs = {}
            # Rounds go over every cell in turn, so that the machine's slow spells spread over all of them.
            for rnd in range(args.rounds):
                for kind, url in cells:
                    if only and kind not in only:
                        continue
                    print(f"[{name}] {kind} (round {rnd + 1}/{args.rounds}) ...", flush=True)
                    r = child(kind, url, args, endpoint, tar_keys)
                    if r is None:
                        continue
                    runs.setdefault(kind, []).append(r)
                    print(f"    {json.dumps(r)}", flush=True)
            for kind, rs in runs.items():
                results[(name, kind)] = median_run(rs)

        print(f"\nworkers={args.workers} batch={args.batch} touch={args.touch}; samples/s (epoch 1 cold, epoch 2 warm)")
        print(f"{'dataset':<7} {'loader':<17} {'cold/s':>9} {'warm/s':>9} {'first(s)':>9} {'RSS main':>9} "
              f"{'(+data)':>8} {'RSS wrk':>8} {'agent':>7} {'origin CPU':>10}")
        for (name, kind), r in results.items():
            e = r["epochs"]
            rate = [x["samples"] / x["seconds"] for x in e]
            agent = f"{r['rss_agent_mib']:6.0f}M" if "rss_agent_mib" in r else "      -"
            extra = r["rss_main_mib"] - r.get("rss_base_mib", 0.0)
            print(f"{name:<7} {kind:<17} {rate[0]:9.1f} {rate[1]:9.1f} {r['first_sample_s']:9.2f} "
                  f"{r['rss_main_mib']:8.0f}M {extra:+7.0f}M {r['rss_worker_mib']:7.0f}M {agent} "
                  f"{r['origin_cpu_s']:9.1f}s")
        print("\nratios (Strata / best baseline, same shards):")
        for name in ("small", "large"):
            for ep, label in ((0, "cold"), (1, "warm")):
                def rate(kind):
                    r = results.get((name, kind))
                    return r["epochs"][ep]["samples"] / r["epochs"][ep]["seconds"] if r else None
                base = [x for x in (rate("mosaic"), rate("webdataset"), rate("litdata")) if x]
                for kind in ("strata-wds", "strata-mds", "strata-wds-zc", "strata-mds-zc", "strata-wds-agent",
                             "strata-mds-agent", "strata-wds-agent-zc", "strata-mds-agent-zc"):
                    if rate(kind) and base:
                        per = ", ".join(f"{b} {rate(kind) / rate(b):.2f}x" for b in ("mosaic", "webdataset", "litdata")
                                        if rate(b))
                        print(f"  {name:<6} {label:<5} {kind:<19} {rate(kind) / max(base):5.2f}x ({per})")
        if args.resume_samples > 0:
            res = resume_bench(args.resume_samples, out)
            print(f"\nresume on a {args.resume_samples}-sample dataset (median of 3, fresh process, open + load "
                  "state + first sample):")
            for label in ("strata, index.json", "strata, manifest", "mosaic"):
                if (label, 0.1) in res and (label, 0.9) in res:
                    a, b = res[(label, 0.1)], res[(label, 0.9)]
                    print(f"  {label:<20} at 10%: {a:.3f} s   at 90%: {b:.3f} s   (90/10 = {b / a:.2f})")
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
