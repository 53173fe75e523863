#!/usr/bin/env python3
"""`strata mount` (FUSE, read through the agent's cache) vs s3fs (Debian's) on the same S3 server and the same
data, side by side in one run, with local disk as the reference for hot reads.

Cells (each the median of --rounds rounds; rounds alternate which system goes first):

1. large files, sequential, cold: --large-mib of --file-mib files, read one after another in 1 MiB reads
   (`cat f > /dev/null`). Cold means: a fresh mount (a new `strata mount` / a new s3fs process, whose stat cache
   is empty), a fresh agent with an empty cache directory for Strata (s3fs runs without `use_cache`, so it has
   no cache of its own to empty), and the page cache dropped (`echo 3 > /proc/sys/vm/drop_caches`) just
   before. The time includes the mount command (Strata lists the location when it mounts; s3fs lists on
   readdir), and the mount time is also printed on its own.
2. large files, hot: the same files again on the same mount right after (nothing dropped), and "warm-agent":
   the page cache dropped, then read again on the same mount (Strata: the agent's cache is warm; s3fs has no
   cache, so it fetches again). Local disk: the same files on local disk read hot, and after a drop (disk-cold).
   Both mounts of a round read through the same fresh agent: the small files are not read before their cold pass.
   Strata's mounts keep hot copies of the large files they read whole (the mount's default, --hot-size 16GiB;
   each mount a directory of its own), and its hot and warm-agent passes read those through FUSE passthrough;
   `--hot-size 0` measures the page-cache path.
3. small files: --small-count files of --small-kib KiB in --dirs directories; the workload walks the tree and,
   in a pool of --threads readers, `os.stat`s every file and reads it whole. Cold (as in 1) and hot (a second
   pass on the same mount).

Prints strata time, s3fs time, their ratio s3fs/strata (how many times faster Strata is), local/strata for the
hot large reads, peak RSS of the agent, the mount processes and s3fs, and one verdict per cell against the
targets: >= 2x s3fs in every cell, hot large reads >= 0.7x local disk.

    python3 bench/mount_vs_s3fs.py [--strata target/release/strata] [--large-mib 1024] [--file-mib 128]
        [--small-count 10000] [--rounds 3] [--s3fs-opts kernel_cache] [--mount-threads N] [--quick]

s3fs runs with `-o ro,use_path_request_style,kernel_cache` (no use_cache; its stat cache and parallel requests
at their defaults: max_stat_cache_size 100000, stat_cache_expire 900, multireq_max 20, parallel_count 5,
multipart_size 10); `--s3fs-opts ""` drops kernel_cache. `enable_noobj_cache` did not help here and
`notsup_compat_dir` hides the directories (the objects have no directory markers), so neither is used.
`--quick` checks that the script works (2 x 8 MiB, 200 small files, 1 round; sizes given explicitly still win).

Needs root (FUSE mounts, drop_caches), .venv (scripts/test.sh: moto, s5cmd), fuse3 and s3fs (apt-get install -y
fuse3 s3fs), and a release build (cargo build --release -p strata-cli). Raw JSON lands in bench/out/.
"""
import argparse
import atexit
import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv", "bin")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from warm_vs_s5cmd import cpu_seconds, free_port, peak_rss_mib, wait_port  # noqa: E402

AK, SK = "benchkey", "bench-secret-key"
RAM_MIB, DISK_GIB, INFLIGHT_MIB = 512, 8, 256
# s3fs as Debian ships it, read-only, on a path-style loopback endpoint; --s3fs-opts adds to it (default
# kernel_cache: the page cache stays valid across opens, as strata mount's FOPEN_KEEP_CACHE keeps it).
S3FS_BASE = "ro,use_path_request_style"
S3FS_EXTRA = "kernel_cache"
STRATA = os.environ.get("STRATA_BENCH_BIN") or os.path.join(ROOT, "target", "release", "strata")
CHUNK = 1 << 20


# ---------------------------------------------------------------------------------------------------- cleanup
class Cleanup:
    """Everything this run started: mounts to unmount, processes to stop. Run on exit, on Ctrl-C, on SIGTERM."""

    def __init__(self):
        self.mounts = []  # mount points, newest last
        self.procs = []  # subprocess.Popen objects
        self.state_dirs = []  # strata mount state dirs (their holder / server processes carry the path)
        self.done = False

    def run(self):
        if self.done:
            return
        self.done = True
        for d in reversed(self.mounts):
            unmount(d, quiet=True)
        for s in self.state_dirs:
            for pid in mount_pids(s):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


CLEANUP = Cleanup()


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def is_mounted(d):
    d = os.path.realpath(d)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == d for line in f)


def unmount(d, quiet=False):
    """umount d (lazily if it is busy); wait until the kernel no longer lists it."""
    if not is_mounted(d):
        return
    r = subprocess.run(["umount", d], capture_output=True, text=True)
    if r.returncode != 0:
        if not quiet:
            print(f"  umount {d}: {r.stderr.strip()}; unmounting lazily")
        subprocess.run(["umount", "-l", d], capture_output=True)
    deadline = time.time() + 10
    while is_mounted(d) and time.time() < deadline:
        time.sleep(0.05)


def mount_pids(state):
    """The processes of one `strata mount` (the holder and its server): their command lines name its state dir."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if state.encode() in args:
            pids.append(int(p))
    return pids


# ---------------------------------------------------------------------------------------------------- helpers
def settle():
    """Flush dirty pages and drop the page cache, dentries and inodes (root only); True if dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def s5(endpoint, *args):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_REGION="us-east-1")
    subprocess.run([os.path.join(VENV, "s5cmd"), "--endpoint-url", endpoint, *args], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def read_large(d, names, sizes):
    """Read each file start to end in 1 MiB reads, one after another; seconds."""
    buf = bytearray(CHUNK)
    t0 = time.perf_counter()
    for name, size in zip(names, sizes):
        got = 0
        with open(os.path.join(d, name), "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                got += n
        if got != size:
            raise RuntimeError(f"{d}/{name}: read {got} bytes, expected {size}")
    return time.perf_counter() - t0


def read_small(d, count, total, threads):
    """Walk d; in a pool of `threads`, stat every file and read it whole; seconds. Checks count and bytes."""

    def one(path):
        st = os.stat(path)
        got = 0
        with open(path, "rb", buffering=0) as f:
            while True:
                b = f.read(max(st.st_size, 1 << 16))
                if not b:
                    break
                got += len(b)
        if got != st.st_size:
            raise RuntimeError(f"{path}: read {got} bytes, stat says {st.st_size}")
        return got

    t0 = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    try:
        futs = []
        for top, dirs, files in os.walk(d):
            dirs.sort()
            futs.extend(pool.submit(one, os.path.join(top, f)) for f in files)
        got = [f.result() for f in futs]
    except BaseException:
        # Ctrl-C or a failed read: drop the queued reads instead of waiting for them (the cleanup then
        # unmounts, which ends the reads in flight).
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    dt = time.perf_counter() - t0
    if len(got) != count or sum(got) != total:
        raise RuntimeError(f"{d}: {len(got)} files / {sum(got)} bytes, expected {count} / {total}")
    return dt


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(CHUNK):
            h.update(b)
    return h.hexdigest()


def verify(mnt, local, rels):
    """The bytes through the mount are the local copy's (untimed, after the timed passes)."""
    for rel in rels:
        if sha(os.path.join(mnt, rel)) != sha(os.path.join(local, rel)):
            raise RuntimeError(f"{mnt}/{rel}: different bytes from the local copy")


# ---------------------------------------------------------------------------------------------------- systems
class Agent:
    """`strata serve` with a fresh, empty data dir (cache included) and one backend on the origin's bucket."""

    def __init__(self, work, origin, tag, request_mib=None):
        self.data = os.path.join(work, f"agent-{tag}")
        shutil.rmtree(self.data, ignore_errors=True)
        os.makedirs(self.data)
        cfg = os.path.join(work, "strata.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[cache]
ram_capacity = "{RAM_MIB}MiB"
disk_capacity = "{DISK_GIB}GiB"
inflight_budget = "{INFLIGHT_MIB}MiB"
{f'max_request_size = "{request_mib}MiB"' if request_mib else ""}

[[backends]]
name = "origin"
url = "s3://bench"
[backends.options]
endpoint = "{origin}"
access_key_id = "{AK}"
secret_access_key = "{SK}"
""")
        self.log = os.path.join(work, f"agent-{tag}.log")
        self.proc = subprocess.Popen([STRATA, "serve", "--config", cfg, "--data-dir", self.data, "--api-listen",
                                      "127.0.0.1:0", "--s3-listen", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "w"),
                                     env=dict(os.environ, STRATA_LOG="warn"))
        CLEANUP.procs.append(self.proc)
        addr_file = os.path.join(self.data, "api.addr")
        deadline = time.time() + 60
        while not (os.path.exists(addr_file) and open(addr_file).read().strip()):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"strata serve did not start:\n{tail(self.log)}")
            time.sleep(0.05)
        api = open(addr_file).read().strip()
        self.api = api if api.startswith("http") else f"http://{api}"
        self.token = open(os.path.join(self.data, "admin-token")).read().strip()

    def stop(self):
        """Stop it; (peak RSS MiB, CPU seconds)."""
        rss, cpu = peak_rss_mib(self.proc.pid), cpu_seconds(self.proc.pid)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.data, ignore_errors=True)
        return rss, cpu


class StrataMount:
    def __init__(self, agent, location, mnt, state, threads=None, hot_size=None):
        self.mnt, self.state = mnt, state
        os.makedirs(mnt, exist_ok=True)
        shutil.rmtree(state, ignore_errors=True)
        # Hot copies (FUSE passthrough) in a directory of this mount's own: a cold pass never finds copies
        # an earlier round made.
        hot = state + "-hot"
        shutil.rmtree(hot, ignore_errors=True)
        cmd = [STRATA, "mount", location, mnt, "--api", agent.api, "--token", agent.token, "--state-dir", state,
               "--hot-dir", hot, *(["--hot-size", hot_size] if hot_size is not None else [])]
        if threads:
            cmd += ["--threads", str(threads)]
        CLEANUP.state_dirs.append(state)
        CLEANUP.mounts.append(mnt)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=330)
        self.mount_s = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"strata mount {location} {mnt} failed ({r.returncode}): {r.stderr.strip()}\n"
                               f"log {state}/log:\n{tail(os.path.join(state, 'log'))}")
        if not is_mounted(mnt):
            raise RuntimeError(f"strata mount returned but {mnt} is not mounted; log:\n"
                               f"{tail(os.path.join(state, 'log'))}")

    def rss(self):
        """Peak RSS of the mount's processes (holder + server), MiB, summed."""
        return sum(peak_rss_mib(p) for p in mount_pids(self.state) if os.path.exists(f"/proc/{p}"))

    def cpu(self):
        total = 0.0
        for p in mount_pids(self.state):
            try:
                total += cpu_seconds(p)
            except OSError:
                pass
        return total

    def umount(self):
        rss, cpu = self.rss(), self.cpu()
        unmount(self.mnt)
        deadline = time.time() + 15
        while mount_pids(self.state) and time.time() < deadline:
            time.sleep(0.05)
        left = mount_pids(self.state)
        if left:
            print(f"  strata mount processes {left} still running 15 s after umount {self.mnt}; stopping them "
                  f"(log {self.state}/log)")
            for p in left:
                os.kill(p, signal.SIGTERM)
        return rss, cpu


class S3fsMount:
    def __init__(self, origin, prefix, mnt, work, opts):
        self.mnt = mnt
        os.makedirs(mnt, exist_ok=True)
        passwd = os.path.join(work, "s3fs.passwd")
        with open(passwd, "w") as f:
            f.write(f"{AK}:{SK}\n")
        os.chmod(passwd, 0o600)
        self.opts = f"{opts},url={origin},passwd_file={passwd}"
        self.log = os.path.join(work, f"s3fs-{os.path.basename(mnt)}.log")
        CLEANUP.mounts.append(mnt)
        t0 = time.perf_counter()
        # -f: s3fs stays our child (its pid gives peak RSS and CPU, and the cleanup can stop it).
        self.proc = subprocess.Popen(["s3fs", f"bench:/{prefix}", mnt, "-f", "-o", self.opts],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        CLEANUP.procs.append(self.proc)
        deadline = time.time() + 60
        while not is_mounted(mnt):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"s3fs did not mount {mnt} (rc {self.proc.poll()}):\n{tail(self.log)}")
            time.sleep(0.01)
        # Mounted once the root answers (s3fs checks the bucket before it serves).
        os.stat(mnt)
        self.mount_s = time.perf_counter() - t0

    def umount(self):
        rss, cpu = peak_rss_mib(self.proc.pid), cpu_seconds(self.proc.pid)
        unmount(self.mnt)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            print(f"  s3fs still running 15 s after umount {self.mnt}; stopping it")
            self.proc.terminate()
            self.proc.wait()
        return rss, cpu


# ---------------------------------------------------------------------------------------------------- main
def main():
    global STRATA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=STRATA, help="the strata binary (default: $STRATA_BENCH_BIN, else "
                                                     "target/release/strata)")
    ap.add_argument("--large-mib", type=int, default=1024, help="total MiB of the large files")
    ap.add_argument("--file-mib", type=int, default=128, help="MiB per large file")
    ap.add_argument("--small-count", type=int, default=10000)
    ap.add_argument("--small-kib", type=int, default=16)
    ap.add_argument("--dirs", type=int, default=100, help="directories the small files are spread over")
    ap.add_argument("--threads", type=int, default=16, help="readers of the small-file workload")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hot-size", default=None,
                    help="strata mount --hot-size: hot copies read through FUSE passthrough (default: the mount's, "
                         "16GiB; 0 reads every pass through FUSE's page cache)")
    ap.add_argument("--mount-threads", type=int, default=None,
                    help="strata mount --threads (default: strata's own default)")
    ap.add_argument("--s3fs-opts", default=S3FS_EXTRA,
                    help=f"more s3fs -o options, comma-separated, added to {S3FS_BASE},url=...,passwd_file=... "
                         f"(default {S3FS_EXTRA}: keep the page cache across opens, as strata mount does; \"\" runs "
                         "s3fs without it, which drops a file's pages at each open)")
    ap.add_argument("--agent-request-mib", type=int, default=None,
                    help="the agent's [cache] max_request_size in MiB (default: the agent's, 32): the largest origin "
                         "request of a sequential fill. moto reads a whole object for every ranged GET, so on it "
                         "fewer, larger requests cost less; on S3 parallel ranges are faster")
    ap.add_argument("--work", default=None, help="parent directory of the scratch directory (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, local copies)")
    ap.add_argument("--quick", action="store_true",
                    help="a check that the script works: 2 x 8 MiB large files, 200 small files in 10 dirs, 1 round")
    a = ap.parse_args()
    if a.quick:  # new defaults; sizes given on the command line still win
        ap.set_defaults(large_mib=16, file_mib=8, small_count=200, dirs=10, rounds=1)
        a = ap.parse_args()
    STRATA = os.path.abspath(a.strata)
    if not os.path.exists(STRATA):
        sys.exit(f"{STRATA} not found: cargo build --release -p strata-cli, or pass --strata")
    if os.geteuid() != 0:
        sys.exit("needs root: FUSE mounts and drop_caches")
    for tool in ("s3fs", "umount"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (apt-get install -y fuse3 s3fs)")
    if not os.path.exists(os.path.join(VENV, "moto_server")):
        sys.exit("no .venv/bin/moto_server: run scripts/test.sh (or pip install -r scripts/requirements-test.txt)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    atexit.register(CLEANUP.run)
    work = tempfile.mkdtemp(prefix="strata-mountbench-", dir=a.work)
    port = free_port()
    moto = subprocess.Popen([os.path.join(VENV, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    CLEANUP.procs.append(moto)
    try:
        run(a, work, port, moto)
    except KeyboardInterrupt as e:
        print(f"\ninterrupted ({str(e) or 'Ctrl-C'}); unmounting and stopping everything", file=sys.stderr)
        raise SystemExit(130)
    finally:
        CLEANUP.run()
        if a.keep:
            print(f"scratch directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(a, work, port, moto):
    wait_port(port)
    origin = f"http://127.0.0.1:{port}"
    s3fs_opts = S3FS_BASE + (f",{a.s3fs_opts.strip(',')}" if a.s3fs_opts.strip(",") else "")

    # ---- data: local copies (the local-disk reference), uploaded once with s5cmd (not timed)
    local = os.path.join(work, "local")
    nlarge = max(1, a.large_mib // a.file_mib)
    large_names = [f"large-{i:03}.bin" for i in range(nlarge)]
    large_sizes = [a.file_mib << 20] * nlarge
    os.makedirs(os.path.join(local, "large"))
    for name in large_names:
        with open(os.path.join(local, "large", name), "wb") as f:
            for _ in range(a.file_mib):
                f.write(os.urandom(1 << 20))
    small_bytes = a.small_kib << 10
    small_rels = []
    for i in range(a.small_count):
        rel = f"d-{i % a.dirs:03}/f-{i:06}.bin"
        small_rels.append(rel)
        p = os.path.join(local, "small", rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(os.urandom(small_bytes))
    small_total = a.small_count * small_bytes
    t0 = time.perf_counter()
    s5(origin, "mb", "s3://bench")
    s5(origin, "cp", os.path.join(local, "large") + "/*", "s3://bench/large/")
    s5(origin, "cp", os.path.join(local, "small") + "/*", "s3://bench/small/")
    upload_s = time.perf_counter() - t0
    total_mib = nlarge * a.file_mib
    print(f"strata: {STRATA}")
    print(f"origin: moto at {origin}; {nlarge} x {a.file_mib} MiB large files, {a.small_count} x {a.small_kib} KiB "
          f"small files in {a.dirs} directories (uploaded with s5cmd in {upload_s:.1f} s, not timed)")
    print(f"agent: ram {RAM_MIB} MiB, disk {DISK_GIB} GiB, in-flight {INFLIGHT_MIB} MiB, max request "
          f"{a.agent_request_mib or 32} MiB; strata mount "
          f"--threads {a.mount_threads or 'default'}")
    print(f"s3fs: s3fs bench:/PREFIX DIR -f -o {s3fs_opts},url={origin},passwd_file=F (no use_cache)")
    fstype = subprocess.run(["df", "--output=fstype", local], capture_output=True, text=True).stdout.split()
    print(f"local disk: {local} ({fstype[-1] if fstype else '?'})")
    print(f"small-file workload: os.walk + stat + read whole, {a.threads} reader threads; large: sequential 1 MiB reads")
    dropped = settle()
    if not dropped:
        print("WARNING: could not drop the page cache: cold cells are not cold")

    cells = ["large_cold", "large_hot", "large_warm", "small_cold", "small_hot"]
    t = {who: {c: [] for c in cells} for who in ("strata", "s3fs")}
    mounts = {who: {"large": [], "small": []} for who in ("strata", "s3fs")}
    t["local"] = {"large_diskcold": [], "large_hot": [], "small_diskcold": [], "small_hot": []}
    rss = {"agent": [], "strata_mount": [], "s3fs": []}
    cpu = {"agent": [], "strata_mount": [], "s3fs": [], "origin_strata": [], "origin_s3fs": []}
    ldir = os.path.join(local, "large")
    sdir = os.path.join(local, "small")

    for r in range(a.rounds):
        order = ["strata", "s3fs"] if r % 2 == 0 else ["s3fs", "strata"]
        for who in order:
            o0 = cpu_seconds(moto.pid)
            mrss, mcpu = [], 0.0
            if who == "strata":
                agent = Agent(work, origin, r, a.agent_request_mib)
            for ds in ("large", "small"):
                mnt = os.path.join(work, f"mnt-{who}-{ds}-{r}")
                settle()
                if who == "strata":
                    m = StrataMount(agent, f"origin/{ds}/", mnt, os.path.join(work, f"state-{ds}-{r}"),
                                    a.mount_threads, a.hot_size)
                else:
                    m = S3fsMount(origin, ds, mnt, work, s3fs_opts)
                mounts[who][ds].append(m.mount_s)
                if ds == "large":
                    cold = read_large(mnt, large_names, large_sizes)
                    hot = read_large(mnt, large_names, large_sizes)
                    settle()
                    warm = read_large(mnt, large_names, large_sizes)
                    t[who]["large_cold"].append(m.mount_s + cold)
                    t[who]["large_hot"].append(hot)
                    t[who]["large_warm"].append(warm)
                    if r == 0:
                        verify(mnt, ldir, large_names[:1])
                    line = (f"mount {m.mount_s:.2f} s, cold read {cold:.2f} s, hot {hot:.2f} s, "
                            f"warm-agent {warm:.2f} s")
                else:
                    cold = read_small(mnt, a.small_count, small_total, a.threads)
                    hot = read_small(mnt, a.small_count, small_total, a.threads)
                    t[who]["small_cold"].append(m.mount_s + cold)
                    t[who]["small_hot"].append(hot)
                    if r == 0:
                        verify(mnt, sdir, small_rels[:: max(1, len(small_rels) // 20)])
                    line = f"mount {m.mount_s:.2f} s, cold {cold:.2f} s, hot {hot:.2f} s"
                peak, c = m.umount()
                mrss.append(peak)
                mcpu += c
                print(f"round {r + 1} {who:6} {ds:5}: {line}")
            cpu["origin_" + who].append(cpu_seconds(moto.pid) - o0)
            if who == "strata":
                peak, c = agent.stop()
                rss["agent"].append(peak)
                cpu["agent"].append(c)
                rss["strata_mount"].append(max(mrss))
                cpu["strata_mount"].append(mcpu)
                print(f"round {r + 1} strata: agent peak RSS {peak:.0f} MiB, cpu {c:.1f} s; mount processes peak "
                      f"RSS {max(mrss):.0f} MiB, cpu {mcpu:.1f} s; origin cpu {cpu['origin_strata'][-1]:.1f} s")
            else:
                rss["s3fs"].append(max(mrss))
                cpu["s3fs"].append(mcpu)
                print(f"round {r + 1} s3fs: peak RSS {max(mrss):.0f} MiB, cpu {mcpu:.1f} s; origin cpu "
                      f"{cpu['origin_s3fs'][-1]:.1f} s")
        # local disk: disk-cold (after a drop), then hot
        settle()
        t["local"]["large_diskcold"].append(read_large(ldir, large_names, large_sizes))
        t["local"]["large_hot"].append(read_large(ldir, large_names, large_sizes))
        settle()
        t["local"]["small_diskcold"].append(read_small(sdir, a.small_count, small_total, a.threads))
        t["local"]["small_hot"].append(read_small(sdir, a.small_count, small_total, a.threads))
        print(f"round {r + 1} local : large disk-cold {t['local']['large_diskcold'][-1]:.2f} s, hot "
              f"{t['local']['large_hot'][-1]:.2f} s; small disk-cold {t['local']['small_diskcold'][-1]:.2f} s, "
              f"hot {t['local']['small_hot'][-1]:.2f} s")

    med = {who: {c: statistics.median(v) for c, v in cs.items()} for who, cs in t.items()}
    mmed = {who: {ds: statistics.median(v) for ds, v in d.items()} for who, d in mounts.items()}
    small_mib = small_total / (1 << 20)
    rows = [
        ("large cold (mount + read)", "large_cold", total_mib, "large_diskcold"),
        ("large hot (page cache warm)", "large_hot", total_mib, "large_hot"),
        ("large warm-agent (page cache dropped)", "large_warm", total_mib, "large_diskcold"),
        ("small cold (mount + walk/stat/read)", "small_cold", small_mib, "small_diskcold"),
        ("small hot (second pass)", "small_hot", small_mib, "small_hot"),
    ]
    print(f"\nmedians of {a.rounds} round(s); page cache dropped: {dropped}; s3fs -o {s3fs_opts}")
    hdr = (f"{'cell':40} {'strata s':>9} {'MiB/s':>7} {'s3fs s':>9} {'MiB/s':>7} {'s3fs/strata':>11} "
           f"{'local s':>9} {'local/strata':>12}")
    print(hdr)
    print("-" * len(hdr))
    result = {"strata": STRATA, "rounds": a.rounds, "large": {"files": nlarge, "file_mib": a.file_mib},
              "small": {"files": a.small_count, "kib": a.small_kib, "dirs": a.dirs, "threads": a.threads},
              "s3fs_opts": s3fs_opts, "page_cache_dropped": dropped,
              "agent": {"ram_mib": RAM_MIB, "disk_gib": DISK_GIB, "inflight_mib": INFLIGHT_MIB,
                        "mount_threads": a.mount_threads, "max_request_mib": a.agent_request_mib},
              "cells": {}, "mount_s": mmed, "raw": t,
              "peak_rss_mib": {k: round(max(v)) for k, v in rss.items()},
              "cpu_s_median": {k: round(statistics.median(v), 2) for k, v in cpu.items()}}
    for label, key, mib, lkey in rows:
        st, s3 = med["strata"][key], med["s3fs"][key]
        lo = med["local"][lkey]
        local_note = "" if lkey in ("large_hot", "small_hot") else " (disk-cold)"
        print(f"{label:40} {st:9.3f} {mib / st:7.0f} {s3:9.3f} {mib / s3:7.0f} {s3 / st:10.2f}x "
              f"{lo:9.3f} {lo / st:11.2f}x{local_note}")
        result["cells"][key] = {"strata_s": round(st, 4), "s3fs_s": round(s3, 4), "local_s": round(lo, 4),
                                "local_kind": lkey, "s3fs_over_strata": round(s3 / st, 3),
                                "local_over_strata": round(lo / st, 3)}
    print(f"mount command (median): strata large {mmed['strata']['large']:.2f} s, small "
          f"{mmed['strata']['small']:.2f} s; s3fs large {mmed['s3fs']['large']:.2f} s, small "
          f"{mmed['s3fs']['small']:.2f} s")
    print(f"peak RSS: agent {max(rss['agent']):.0f} MiB, strata mount (holder + server) "
          f"{max(rss['strata_mount']):.0f} MiB, s3fs {max(rss['s3fs']):.0f} MiB")
    print("cpu s (median per round): " + ", ".join(f"{k} {v}" for k, v in result["cpu_s_median"].items()))

    print("\nverdicts (targets: >= 2x s3fs in every cell; hot large >= 0.7x local disk hot):")
    verdicts = {}
    for label, key, _, _ in rows:
        c = result["cells"][key]
        ok = c["s3fs_over_strata"] >= 2.0
        msg = f"{c['s3fs_over_strata']:.2f}x s3fs (>= 2x)"
        if key == "large_hot":
            ok_local = c["local_over_strata"] >= 0.7
            msg += f", {c['local_over_strata']:.2f}x local disk hot (>= 0.7x)"
            ok = ok and ok_local
        verdicts[key] = ok
        print(f"  {label:40} {'PASS' if ok else 'FAIL'}: {msg}")
    result["verdicts"] = verdicts
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    out = os.path.join(ROOT, "bench", "out", "mount_vs_s3fs.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
