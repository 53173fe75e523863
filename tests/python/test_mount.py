"""`strata mount` end to end: a dataset on a real S3 server (moto) behind `strata serve`, mounted read-only with
FUSE, read by unmodified programs (cp, diff, find, stat, numpy, mmap, a torch DataLoader over a class-folder walk).

Covered: the tree and bytes of a dataset with ugly keys (unnameable keys left out, a directory beating an object
of the same name, a trailing-`/` marker making a directory); random preads and reads past the end; concurrent
readers; numpy and mmap; a read-only file system that changes nothing at the origin; a server killed (kill -9)
under a reader that notices nothing; an agent restarted under a pending read; an object changed at the origin
after mounting reading as ESTALE; unmounting with `umount` and with SIGTERM to the holder; owner, mode and
allow_other; a user's mount without root (fusermount3); a caller without the right to read the location; bad
input.

Needs root (mount(2); the user's mount runs as nobody), /dev/fuse and fusermount3; skipped without them unless STRATA_REQUIRE_FUSE=1.
"""
import errno
import hashlib
import io
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, Gateway, api_get, client, free_port, poll

MIB = 1024 * 1024
BUCKET = "gw-origin"

_MISSING = [w for w, ok in (("/dev/fuse", os.path.exists("/dev/fuse")),
                            ("fusermount3", shutil.which("fusermount3") is not None),
                            ("root (mount(2))", os.geteuid() == 0)) if not ok]


@pytest.fixture(scope="module", autouse=True)
def _need_fuse():
    if _MISSING:
        msg = "FUSE mounts need " + ", ".join(_MISSING)
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            pytest.fail(msg + " (STRATA_REQUIRE_FUSE=1)", pytrace=False)
        pytest.skip(msg)


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def _unescape(p):
    """A path as /proc/mounts writes it (octal escapes for space, tab, newline, backslash)."""
    out, i = [], 0
    while i < len(p):
        if p[i] == "\\" and p[i + 1:i + 4].isdigit() and len(p[i + 1:i + 4]) == 3:
            out.append(chr(int(p[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(p[i])
            i += 1
    return "".join(out)


def mounted(d):
    """The /proc/mounts entry (fields) of mount point `d`, or None."""
    d = os.path.realpath(d)
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3 and _unescape(fields[1]) == d:
                return fields
    return None


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except (OSError, IndexError):
        return None


def mount_procs(state):
    """(holders, servers): pids of the live holder (`strata mount ... --foreground`) and server
    (`strata __mount-serve STATE`) processes of the mount whose state directory is `state`."""
    state = str(state)
    holders, servers = [], []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        args = _cmdline(d)
        if not args or len(args) < 3:
            continue
        if args[1] == "__mount-serve" and args[2] == state:
            servers.append(int(d))
        elif args[1] == "mount" and "--foreground" in args and state in args:
            holders.append(int(d))
    return holders, servers


def alive(pid):
    return _cmdline(pid) is not None


def wait_for(cond, timeout, what):
    """conftest's `poll`, in the argument order of this file's calls, polling faster (mounts change quickly)."""
    return poll(what, cond, timeout, every=0.05)


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def sha(b):
    return hashlib.sha256(b).hexdigest()


def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(MIB)
            if not b:
                return h.hexdigest()
            h.update(b)


def origin_listing(s3, prefix):
    """{key: etag} of every object under `prefix` at the origin."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["ETag"]
    return out


def put_all(s3, objects):
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda kv: s3.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]), objects.items()))


class Mount:
    """One mount made by a test: its directory, state directory and the command's result."""

    def __init__(self, d, state, result=None, log=None):
        self.dir, self.state, self.result = str(d), str(state), result
        self.logfile = log or os.path.join(self.state, "log")  # the holder's log (`--foreground`: its output)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def procs(self):
        return mount_procs(self.state)

    def server(self):
        """The one live server pid (waits for it)."""
        pids = wait_for(lambda: self.procs()[1], 30, f"a server of {self.state}")
        assert len(pids) == 1, pids
        return pids[0]


class Mounter:
    """Makes mounts for one test, and takes every one of them down afterwards, whatever happened."""

    def __init__(self, base):
        self.base = str(base)
        self.made = []
        self.popens = []
        self.filesystems = []
        self.n = 0

    def _paths(self, d=None):
        self.n += 1
        state = os.path.join(self.base, f"state-{self.n}")
        if d is None:
            d = os.path.join(self.base, f"mnt-{self.n}")
            os.makedirs(d)
        self.made.append((str(d), state))
        return str(d), state

    def hot_dir(self):
        """The hot copies of this test's mounts (never the machine's default directory): a tmpfs of the test's
        own, so that whether a copy fits (a tenth of its file system stays free) never depends on how full the
        machine's disk is."""
        d = os.path.join(self.base, "hot")
        if d not in self.filesystems:
            self.filesystem(d, "256m")
        return d

    def filesystem(self, d, size):
        """A tmpfs of `size` on `d` (made), unmounted at cleanup."""
        os.makedirs(d, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "strata-test", d], check=True,
                       capture_output=True, timeout=30)
        self.filesystems.append(d)
        return d

    def args(self, api, location, d, state, *opts, token=ADMIN_TOKEN):
        hot = [] if "--hot-dir" in opts else ["--hot-dir", self.hot_dir()]
        return [STRATA, "mount", location, d, "--api", api, "--state-dir", state,
                *([] if token is None else ["--token", token]), *hot, *opts]

    def mount(self, api, location, *opts, token=ADMIN_TOKEN, d=None, check=True):
        d, state = self._paths(d)
        r = subprocess.run(self.args(api, location, d, state, *opts, token=token), capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, STRATA_LOG="info"))
        m = Mount(d, state, r)
        if check:
            assert r.returncode == 0, f"strata mount: {r.returncode}\n{r.stdout}\n{r.stderr}\n{m.log()}"
            assert mounted(d), f"{d} is not in /proc/mounts:\n{m.log()}"
        return m

    def foreground(self, api, location, *opts, token=ADMIN_TOKEN):
        d, state = self._paths()
        logfile = os.path.join(self.base, f"fg-{self.n}.log")
        with open(logfile, "wb") as log:
            p = subprocess.Popen(self.args(api, location, d, state, "--foreground", *opts, token=token),
                                 stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, STRATA_LOG="info"))
        self.popens.append(p)
        return Mount(d, state, log=logfile), p

    @staticmethod
    def _unmount(d):
        for _ in range(5):  # a mount made twice on one directory is there twice
            if not mounted(d):
                return
            subprocess.run(["umount", "-l", d], capture_output=True, timeout=30)

    def cleanup(self):
        for d, state in self.made:
            self._unmount(d)
            holders, servers = mount_procs(state)
            for pid in holders + servers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
        for d, state in self.made:
            try:
                wait_for(lambda: mount_procs(state) == ([], []), 15, f"the processes of {state} to exit")
            except AssertionError:
                pass
            self._unmount(d)
        for d in self.filesystems:
            self._unmount(d)


@pytest.fixture()
def mounts(tmp_path):
    m = Mounter(tmp_path)
    try:
        yield m
    finally:
        m.cleanup()


@pytest.fixture(scope="module")
def gw(origin):
    g = Gateway(origin)
    yield g
    g.close()


@pytest.fixture(scope="module")
def s3(origin):
    return client(origin, ORIGIN_KEY, ORIGIN_SECRET)


# ---------------------------------------------------------------------------------------------------------------
# The dataset most tests read

DS = "mnt-ds/"
BIG = ["big/one.bin", "big/two.bin"]
# Keys that cannot be paths, or lose to a directory of the same name: not in the mount.
LEFT_OUT = ["ugly/a//b", "ugly/dots/../up", "ugly/./dot", "clash/x"]


@pytest.fixture(scope="module")
def dataset(s3, tmp_path_factory):
    """Uploads the dataset under mnt-ds/; returns {files: {relpath: bytes}, expected: dir, uploaded: unix time}."""
    rng = np.random.default_rng(20240601)
    sizes = [0, 1, 4095, 4096, 4097, MIB - 1, MIB, MIB + 1, 3 * MIB]
    sizes += [int(x) for x in rng.integers(0, 3 * MIB, 40 - len(sizes))]
    files = {}
    for i, n in enumerate(sizes):
        files[f"d{i % 4}/sub{i % 3}/f{i:02d}.bin"] = rng.bytes(n)
    files[BIG[0]] = rng.bytes(20 * MIB)
    files[BIG[1]] = rng.bytes(20 * MIB + 12345)
    for name in ["with space.txt", "plus+sign.txt", "percent%20.txt", "hash#tag.txt", "café é.txt",
                 "日本/データ.bin"]:
        files[f"ugly/{name}"] = rng.bytes(int(rng.integers(1, 5000)))
    files["clash/x/y"] = b"the directory wins"
    objects = {DS + k: v for k, v in files.items()}
    objects[DS + "ugly/empty-dir/"] = b""   # a directory marker: an empty directory
    objects[DS + "d0/"] = b""               # a marker of a directory that has files anyway
    for k in LEFT_OUT:
        objects[DS + k] = b"left out"
    uploaded = time.time()
    put_all(s3, objects)
    expected = str(tmp_path_factory.mktemp("expected"))
    for rel, body in files.items():
        p = os.path.join(expected, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(body)
    os.makedirs(os.path.join(expected, "ugly", "empty-dir"))
    return {"files": files, "expected": expected, "uploaded": uploaded}


# ---------------------------------------------------------------------------------------------------------------
# 1. The tree and the bytes


def test_cp_diff_find_stat_of_a_dataset_with_ugly_names(gw, dataset, mounts, tmp_path):
    m = mounts.mount(gw.api, "origin/" + DS)
    files = dataset["files"]
    fields = mounted(m.dir)
    assert fields[2] == "fuse.strata" and "ro" in fields[3].split(","), fields
    copy = str(tmp_path / "copy")
    r = subprocess.run(["cp", "-r", m.dir, copy], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["diff", "-r", dataset["expected"], copy], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"diff -r:\n{r.stdout[:3000]}{r.stderr}\n{m.log()[-3000:]}"
    r = subprocess.run(f"find '{m.dir}' -type f | wc -l", shell=True, capture_output=True, text=True, timeout=60)
    assert int(r.stdout.strip()) == len(files), r.stdout
    found = set()
    for root, dirs, names in os.walk(m.dir):
        for n in names:
            found.add(os.path.relpath(os.path.join(root, n), m.dir))
    assert found == set(files)
    assert sorted(os.listdir(m.dir)) == ["big", "clash", "d0", "d1", "d2", "d3", "ugly"]
    assert sorted(os.listdir(m.path("ugly"))) == sorted(
        ["with space.txt", "plus+sign.txt", "percent%20.txt", "hash#tag.txt", "café é.txt", "日本", "empty-dir"])
    assert os.listdir(m.path("ugly", "empty-dir")) == []
    assert os.path.isdir(m.path("clash", "x")) and os.listdir(m.path("clash", "x")) == ["y"]
    for gone in ("ugly/a", "ugly/dots", "ugly/up", "ugly/dot"):
        assert not os.path.lexists(m.path(gone)), gone
    # Sizes and times as listed.
    up = dataset["uploaded"]
    for rel, body in files.items():
        st = os.stat(m.path(rel))
        assert st.st_size == len(body), rel
        assert st.st_mtime > 0 and abs(st.st_mtime - up) < 3600, (rel, st.st_mtime, up)
    st = os.stat(m.path("d1", "sub1"))
    assert st.st_mtime > 0 and abs(st.st_mtime - up) < 3600
    r = subprocess.run(["stat", "-c", "%s", m.path(BIG[1])], capture_output=True, text=True)
    assert int(r.stdout) == 20 * MIB + 12345
    # The keys left out are named in the log.
    log = m.log()
    assert "skipped=4" in log and all(f'"{k}"' in log for k in LEFT_OUT), log


# ---------------------------------------------------------------------------------------------------------------
# 2. Random reads


def test_random_preads_and_reads_past_the_end(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS)
    files = dataset["files"]
    rng = random.Random(7)
    fds = {rel: os.open(m.path(rel), os.O_RDONLY) for rel in BIG}
    try:
        for i in range(200):
            rel = BIG[i % 2]
            body = files[rel]
            off = rng.randrange(0, len(body) + 4096)
            n = rng.choice([1, 7, 4096, rng.randrange(1, 64 * 1024), rng.randrange(1, 3 * MIB)])
            got = os.pread(fds[rel], n, off)
            assert got == body[off:off + n], (rel, off, n, len(got))
        for rel in BIG:
            size = len(files[rel])
            assert os.pread(fds[rel], 100, size - 10) == files[rel][-10:]
            assert os.pread(fds[rel], 100, size) == b""
            assert os.pread(fds[rel], 100, size + 10 * MIB) == b""
    finally:
        for fd in fds.values():
            os.close(fd)
    # A small file (read whole by its first read) and an empty one, past their ends too.
    small = "d0/sub1/f04.bin"
    with open(m.path(small), "rb") as f:
        f.seek(len(files[small]) - 3)
        assert f.read(100) == files[small][-3:]
        assert f.read(100) == b""
    with open(m.path("d0/sub0/f00.bin"), "rb") as f:
        assert f.read() == b""


def backend_bytes(api):
    """Bytes the agent at `api` has read from its backends (`strata_io_bytes_total`, GETs of tier backend)."""
    base = api if "://" in api else f"http://{api}"
    text = api_get(f"{base}/metrics").read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("strata_io_bytes_total") and 'op="get"' in line and 'tier="backend"' in line)


def test_a_sequential_reader_near_a_files_end_has_the_next_file_fetched(origin, s3, mounts):
    # a.bin, b.bin, c.bin in one directory (cp -r, a loader over sorted shards): while a.bin is read to its end
    # the agent is already fetching b.bin, so the origin does not sit idle between files; c.bin waits until
    # b.bin is read. An agent of its own: its origin counter counts this test only.
    rng = np.random.default_rng(11)
    body = {n: rng.bytes(20 * MIB + i) for i, n in enumerate(["a.bin", "b.bin", "c.bin"])}
    put_all(s3, {f"mnt-next/{n}": b for n, b in body.items()})
    agent = Gateway(origin)
    try:
        m = mounts.mount(agent.api, "origin/mnt-next/")
        with open(m.path("a.bin"), "rb") as f:
            got = b"".join(iter(lambda: f.read(MIB), b""))
        assert got == body["a.bin"]
        a, b, c = (len(body[n]) for n in ("a.bin", "b.bin", "c.bin"))
        wait_for(lambda: backend_bytes(agent.api) >= a + b, 20, "b.bin fetched before it is opened")
        time.sleep(1)
        assert backend_bytes(agent.api) < a + b + c, "only the next file is fetched ahead, not c.bin"
        with open(m.path("b.bin"), "rb") as f:
            assert f.read() == body["b.bin"]
        # b.bin came from the agent's cache: the origin read it once.
        assert backend_bytes(agent.api) <= a + b + c + 2 * 8 * MIB
        with open(m.path("c.bin"), "rb") as f:
            assert f.read() == body["c.bin"]
        assert backend_bytes(agent.api) <= a + b + c + 2 * 8 * MIB
    finally:
        agent.close()


# ---------------------------------------------------------------------------------------------------------------
# 3. Concurrent readers


def test_eight_concurrent_readers_are_byte_exact(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS, "--threads", "4")
    files = dataset["files"]
    small = sorted(k for k in files if k.startswith("d"))
    want = {rel: sha(b) for rel, b in files.items()}
    barrier = threading.Barrier(8)
    results, errors = [], []

    def reader(i):
        try:
            barrier.wait(timeout=30)
            # All eight read the same big file at once, then each its own files.
            mine = [BIG[0], BIG[1] if i % 2 else small[i], *small[i::8]]
            for rel in mine:
                results.append((rel, sha_file(m.path(rel))))
        except Exception as e:  # noqa: BLE001 — reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert not errors, errors
    assert len(results) >= 8 * 2 + len(small)
    bad = [(rel, h) for rel, h in results if h != want[rel]]
    assert not bad, bad


# ---------------------------------------------------------------------------------------------------------------
# 4. numpy, mmap, a torch DataLoader


def test_numpy_and_mmap_read_the_mount(gw, s3, mounts):
    rng = np.random.default_rng(4)
    arr = rng.standard_normal((3000, 1024)).astype(np.float32)  # 12 MiB: more than one chunk
    buf = io.BytesIO()
    np.save(buf, arr)
    raw = rng.integers(-30000, 30000, 2_621_441, dtype=np.int16)
    blob = rng.bytes(17 * MIB + 5)
    put_all(s3, {"mnt-np/arr.npy": buf.getvalue(), "mnt-np/raw.i16": raw.tobytes(), "mnt-np/blob.bin": blob})
    m = mounts.mount(gw.api, "origin/mnt-np/")
    np.testing.assert_array_equal(np.load(m.path("arr.npy")), arr)
    mm = np.load(m.path("arr.npy"), mmap_mode="r")
    np.testing.assert_array_equal(mm[2999], arr[2999])
    np.testing.assert_array_equal(mm[::7], arr[::7])
    del mm
    np.testing.assert_array_equal(np.fromfile(m.path("raw.i16"), dtype=np.int16), raw)
    with open(m.path("blob.bin"), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mp:
        assert len(mp) == len(blob)
        r = random.Random(1)
        for _ in range(50):
            off = r.randrange(len(blob))
            assert mp[off:off + 10000] == blob[off:off + 10000], off
        assert mp[:] == blob


def test_a_torch_dataloader_walks_class_folders(gw, s3, mounts):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    rng = np.random.default_rng(5)
    objects = {}
    for cls in ("cat", "dog", "émeu"):
        for i in range(12):
            objects[f"mnt-img/{cls}/{i:03d}.raw"] = rng.bytes(int(rng.integers(100, 300_000)))
    put_all(s3, objects)
    m = mounts.mount(gw.api, "origin/mnt-img/")

    class Folder(Dataset):  # what ImageFolder does, without decoding
        def __init__(self, root):
            self.classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
            self.items = []
            for ci, c in enumerate(self.classes):
                for dirpath, _, names in sorted(os.walk(os.path.join(root, c))):
                    for n in sorted(names):
                        self.items.append((os.path.join(dirpath, n), ci))

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            p, c = self.items[i]
            with open(p, "rb") as f:
                data = f.read()
            return os.path.relpath(p, m.dir), hashlib.sha256(data).hexdigest(), len(data), c

    ds = Folder(m.dir)
    assert ds.classes == ["cat", "dog", "émeu"] and len(ds) == 36
    seen = {}
    for rels, hashes, sizes, classes in DataLoader(ds, batch_size=5, num_workers=2, shuffle=True):
        for rel, h, n, c in zip(rels, hashes, sizes, classes):
            seen[rel] = (h, int(n), ds.classes[int(c)])
    assert seen == {k[len("mnt-img/"):]: (sha(v), len(v), k.split("/")[1]) for k, v in objects.items()}


# ---------------------------------------------------------------------------------------------------------------
# 5. Read-only


def test_the_mount_is_read_only_and_the_origin_unchanged(gw, dataset, mounts, s3):
    before = origin_listing(s3, DS)
    m = mounts.mount(gw.api, "origin/" + DS)
    f = m.path("d1", "sub1", "f01.bin")
    refused = (errno.EROFS, errno.EACCES, errno.EPERM)
    attempts = {
        "open for write": lambda: open(f, "r+b"),
        "open for append": lambda: open(f, "ab"),
        "open with O_TRUNC": lambda: os.open(f, os.O_RDONLY | os.O_TRUNC),
        "create": lambda: open(m.path("d1", "new.bin"), "wb"),
        "O_CREAT|O_EXCL": lambda: os.open(m.path("new2"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644),
        "mkdir": lambda: os.mkdir(m.path("d1", "newdir")),
        "rmdir": lambda: os.rmdir(m.path("ugly", "empty-dir")),
        "unlink": lambda: os.unlink(f),
        "rename": lambda: os.rename(f, m.path("d1", "renamed.bin")),
        "rename a directory": lambda: os.rename(m.path("d2"), m.path("d9")),
        "truncate": lambda: os.truncate(f, 0),
        "chmod": lambda: os.chmod(f, 0o777),
        "symlink": lambda: os.symlink("/etc/passwd", m.path("link")),
        "link": lambda: os.link(f, m.path("hard")),
        "utime": lambda: os.utime(f, (0, 0)),
        "setxattr": lambda: os.setxattr(f, "user.x", b"1"),
    }
    outcomes = {}
    for what, act in attempts.items():
        try:
            r = act()
            outcomes[what] = "succeeded"
            if hasattr(r, "close"):
                r.close()
            elif isinstance(r, int):
                os.close(r)
        except OSError as e:
            outcomes[what] = e.errno
    bad = {w: o for w, o in outcomes.items() if o not in refused}
    assert not bad, bad
    assert outcomes["open for write"] == errno.EROFS and outcomes["mkdir"] == errno.EROFS, outcomes
    with open(f, "rb") as fh:
        assert fh.read() == dataset["files"]["d1/sub1/f01.bin"]
    assert not os.path.lexists(m.path("d1", "new.bin")) and os.path.isdir(m.path("ugly", "empty-dir"))
    assert origin_listing(s3, DS) == before


# ---------------------------------------------------------------------------------------------------------------
# 6. kill -9 of the server under a reader

READER = r"""
import hashlib, json, os, sys, time
files, stop, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
n = 0
while True:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    res, t = {}, time.time()
    for i, p in enumerate(files):
        h = hashlib.sha256()
        try:
            with open(p, "rb", buffering=0) as f:
                done = 0
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    h.update(b)
                    done += len(b)
                    # Where this pass is (the test kills the server in the middle of one).
                    with open(out + ".at", "w") as g:
                        g.write("%d %d %d" % (n, i, done))
            res[p] = h.hexdigest()
        except OSError as e:
            res[p] = "error %s %s" % (e.errno, e)
    with open(out, "a") as f:
        f.write(json.dumps({"hashes": res, "secs": time.time() - t}) + "\n")
    n += 1
    if os.path.exists(stop):
        break
"""


def _lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f.read().splitlines() if x.strip()]
    except FileNotFoundError:
        return []


def _at(path):
    try:
        with open(path + ".at") as f:
            a = tuple(int(x) for x in f.read().split())
        return a if len(a) == 3 else None  # None: caught while being rewritten
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.parametrize("hot", ["passthrough", "page-cache"])
def test_kill_9_of_the_server_is_not_seen_by_a_reader(gw, dataset, mounts, tmp_path, hot):
    # passthrough: from the second pass on, the files are opened through their hot copies.
    m = mounts.mount(gw.api, "origin/" + DS, "--hot-size", "1GiB" if hot == "passthrough" else "0")
    holders, servers = m.procs()
    assert len(holders) == 1 and len(servers) == 1, (holders, servers)
    holder = holders[0]
    paths = [m.path(rel) for rel in BIG]
    want = {m.path(rel): sha(dataset["files"][rel]) for rel in BIG}
    stop, out = str(tmp_path / "stop"), str(tmp_path / "reads.jsonl")
    reader = subprocess.Popen([sys.executable, "-c", READER, json.dumps(paths), stop, out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    rng = random.Random(3)
    killed, kill_points = [], []
    try:
        for k in range(3):
            # Kill in the middle of a pass: inside one of the two files, at a different place each time.
            n = len(_lines(out))
            file_i, lo = k % 2, rng.randrange(2, 14) * MIB
            deadline = time.time() + 120
            while reader.poll() is None:
                a = _at(out)
                if a and a[0] >= n and a[1] == file_i and lo <= a[2] <= lo + 4 * MIB:
                    break
                assert time.time() < deadline, "the reader never got to the middle of a pass"
                time.sleep(0.001)
            assert reader.poll() is None, reader.stdout.read()
            old = m.server()
            kill_points.append(_at(out))
            os.kill(old, signal.SIGKILL)
            killed.append(old)
            wait_for(lambda: [p for p in m.procs()[1] if p not in killed], 30, "a new server")
        n = len(_lines(out))
        wait_for(lambda: len(_lines(out)) >= n + 2 or reader.poll() is not None, 120, "two more passes")
        open(stop, "w").close()
        reader.wait(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    passes = _lines(out)
    assert reader.returncode == 0, reader.stdout.read()
    errors = [h for res in passes for h in res["hashes"].values() if h.startswith("error")]
    assert not errors, f"{errors[:5]}\n{m.log()[-4000:]}"
    assert all(res["hashes"] == want for res in passes), passes
    assert len(passes) >= 3
    assert mounted(m.dir), m.log()[-3000:]
    holders, servers = m.procs()
    assert holders == [holder], (holders, holder)
    assert len(servers) == 1 and servers[0] not in killed, (servers, killed)
    assert m.log().count("the mount's server died") == 3, m.log()[-3000:]
    assert sha_file(m.path(BIG[0])) == want[m.path(BIG[0])]
    copies = [f for f in os.listdir(mounts.hot_dir()) if f != "tmp"] if os.path.isdir(mounts.hot_dir()) else []
    assert len(copies) == (2 if hot == "passthrough" else 0), copies
    print("passes (s):", [round(p["secs"], 2) for p in passes], "killed at:", kill_points)


# ---------------------------------------------------------------------------------------------------------------
# 7. An agent restarted under a read


class FixedApiGateway(Gateway):
    """A Gateway whose API keeps its port across restarts (a mount knows its agent by address)."""

    def __init__(self, origin_endpoint):
        self.api_port = free_port()
        self.api_listen = f"127.0.0.1:{self.api_port}"  # Gateway.start listens there
        super().__init__(origin_endpoint)



ONE_READ = r"""
import hashlib, sys, time
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
t = time.time()
try:
    with open(sys.argv[1], "rb") as f:
        print(hashlib.sha256(f.read()).hexdigest(), time.time() - t)
except OSError as e:
    print("error", e.errno, e)
"""


def test_a_read_waits_for_a_restarted_agent(origin, s3, mounts):
    body = np.random.default_rng(7).bytes(10 * MIB + 3)
    small = b"small file, read whole"
    put_all(s3, {"mnt-agent/f.bin": body, "mnt-agent/s.txt": small})
    g = FixedApiGateway(origin)
    try:
        api = g.api
        m = mounts.mount(api, "origin/mnt-agent/", "--agent-wait", "60")
        g.kill()
        readers = [subprocess.Popen([sys.executable, "-c", ONE_READ, m.path(n)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for n in ("f.bin", "s.txt")]
        try:
            time.sleep(1.5)
            # The agent is down: nothing can have been read yet.
            assert all(r.poll() is None for r in readers), [r.stdout.read() for r in readers if r.poll() is not None]
            g.start()
            assert g.api == api, (g.api, api)
            outs = [r.communicate(timeout=60)[0].split() for r in readers]
        finally:
            for r in readers:
                if r.poll() is None:
                    r.kill()
                    r.wait()
        assert outs[0][0] == sha(body), (outs, m.log()[-3000:])
        assert outs[1][0] == sha(small), (outs, m.log()[-3000:])
        assert float(outs[0][1]) < 60
        assert mounted(m.dir)
    finally:
        g.close()


# ---------------------------------------------------------------------------------------------------------------
# 8. An object changed at the origin after mounting


def test_an_object_changed_after_mounting_reads_as_estale(gw, s3, mounts):
    rng = np.random.default_rng(8)
    old = {n: rng.bytes(s) for n, s in [("small.bin", 100_000), ("chunked.bin", 3 * MIB), ("gone.bin", 5000),
                                         ("big.bin", 30 * MIB), ("c-keep.bin", 2 * MIB)]}
    # c-keep.bin sorts right after big.bin: a read of big.bin has the agent fetch ahead into the next file of
    # the directory, which must be one that does not change here (the changed ones must not be cached yet).
    put_all(s3, {f"mnt-chg/{n}": b for n, b in old.items()})
    m = mounts.mount(gw.api, "origin/mnt-chg/")
    # Read the start of big.bin first: its first chunks are fetched (with the old ETag; the listed version);
    # the rest is not read yet.
    with open(m.path("big.bin"), "rb") as f:
        assert f.read(4096) == old["big.bin"][:4096]
    new = {n: rng.bytes(len(old[n])) for n in ("small.bin", "chunked.bin", "big.bin")}
    put_all(s3, {f"mnt-chg/{n}": b for n, b in new.items()})
    s3.delete_object(Bucket=BUCKET, Key="mnt-chg/gone.bin")
    for n in ("small.bin", "chunked.bin", "gone.bin"):
        with pytest.raises(OSError) as e:
            with open(m.path(n), "rb") as f:
                got = f.read()
                raise AssertionError(f"{n} read {len(got)} bytes (new: {got == new.get(n)}, "
                                     f"old: {got == old[n]})")
        assert e.value.errno == errno.ESTALE, (n, e.value, m.log()[-2000:])
    # big.bin's later chunks: the agent's prefetch ahead of the first read may already hold them (of the listed
    # version, which is what the mount serves), or not (then the origin has only the new version): the listed
    # bytes or ESTALE, never the new bytes and never a mix.
    try:
        with open(m.path("big.bin"), "rb") as f:
            f.seek(24 * MIB + 100)
            got = f.read(MIB)
        assert got == old["big.bin"][24 * MIB + 100:25 * MIB + 100], (
            f"big.bin read {len(got)} bytes, new: {got == new['big.bin'][24 * MIB + 100:25 * MIB + 100]}")
    except OSError as e:
        assert e.errno == errno.ESTALE, (e, m.log()[-2000:])
    # Sizes still as listed, and an unchanged object still reads.
    assert os.stat(m.path("chunked.bin")).st_size == 3 * MIB
    assert sha_file(m.path("c-keep.bin")) == sha(old["c-keep.bin"])


# ---------------------------------------------------------------------------------------------------------------
# 9. Unmounting


def test_umount_and_sigterm_take_the_mount_down(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS)
    holders, servers = m.procs()
    assert len(holders) == 1 and len(servers) == 1, (holders, servers)
    assert os.listdir(m.dir)
    r = subprocess.run(["umount", m.dir], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not any(alive(p) for p in holders + servers), 10, "the holder and server to exit")
    assert not mounted(m.dir)
    assert os.listdir(m.dir) == []
    assert not os.path.exists(os.path.join(m.state, "ready"))
    assert "unmounted" in m.log(), m.log()[-2000:]

    fg, p = mounts.foreground(gw.api, "origin/" + DS)
    wait_for(lambda: mounted(fg.dir) and os.path.exists(os.path.join(fg.state, "ready")) or p.poll() is not None,
             60, "the foreground mount")
    assert p.poll() is None and mounted(fg.dir)
    assert os.path.getsize(fg.path(BIG[0])) == 20 * MIB
    holders, servers = fg.procs()
    assert holders == [p.pid] and len(servers) == 1, (holders, servers, p.pid)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=15) == 0, fg.log()[-2000:]
    assert not mounted(fg.dir)
    wait_for(lambda: not alive(servers[0]), 10, "the server to exit")
    assert os.listdir(fg.dir) == []


# ---------------------------------------------------------------------------------------------------------------
# 10. Owner, mode, allow_other


def _as_nobody(*cmd):
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, timeout=60)


def test_owner_mode_and_allow_other_decide_who_reads(gw, s3, mounts):
    body = b"only some may read this\n" * 100
    put_all(s3, {"mnt-acl/sub/f.txt": body})
    base = tempfile.mkdtemp(prefix="strata-mnt-acl-", dir="/tmp")  # traversable by nobody
    os.chmod(base, 0o755)
    try:
        dirs = []
        for i in range(3):
            d = os.path.join(base, f"m{i}")
            os.mkdir(d)
            os.chmod(d, 0o755)
            dirs.append(d)
        # nobody's files, group-readable, others let in: nobody reads.
        a = mounts.mount(gw.api, "origin/mnt-acl/", "--uid", "65534", "--gid", "65534", "--mode", "0440",
                         "--allow-other", d=dirs[0])
        st = os.stat(a.path("sub", "f.txt"))
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65534, 0o440)
        assert os.stat(a.path("sub")).st_mode & 0o777 == 0o550
        r = _as_nobody("cat", a.path("sub", "f.txt"))
        assert r.returncode == 0 and r.stdout == body, r.stderr
        # root's files, owner-only: nobody is refused.
        b = mounts.mount(gw.api, "origin/mnt-acl/", "--uid", "0", "--gid", "0", "--mode", "0400", "--allow-other",
                         d=dirs[1])
        assert os.stat(b.path("sub", "f.txt")).st_mode & 0o777 == 0o400
        r = _as_nobody("cat", b.path("sub", "f.txt"))
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (r.returncode, r.stdout[:100], r.stderr)
        # Without allow_other nobody is refused even with 0444 (the kernel lets only the mounter in).
        c = mounts.mount(gw.api, "origin/mnt-acl/", d=dirs[2])
        assert os.stat(c.path("sub", "f.txt")).st_mode & 0o777 == 0o444
        with open(c.path("sub", "f.txt"), "rb") as f:
            assert f.read() == body
        r = _as_nobody("cat", c.path("sub", "f.txt"))
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (r.returncode, r.stdout[:100], r.stderr)
        r = _as_nobody("ls", c.dir)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (r.returncode, r.stdout[:100], r.stderr)
    finally:
        mounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


def test_a_user_without_root_mounts_reads_and_unmounts_through_fusermount3(gw, dataset, mounts):
    base = tempfile.mkdtemp(prefix="strata-mnt-user-", dir="/tmp")  # traversable by nobody
    os.chmod(base, 0o755)
    d, state = os.path.join(base, "mnt"), os.path.join(base, "state")
    os.mkdir(d)
    os.chown(d, 65534, 65534)
    os.mkdir(state)
    os.chown(state, 65534, 65534)
    mounts.made.append((d, state))
    # Users open /dev/fuse themselves (fusermount3 only mounts): crw-rw-rw-, as Debian's udev makes it; a
    # container may have it root's alone.
    dev_mode = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", 0o666)
    try:
        r = subprocess.run(["runuser", "-u", "nobody", "--", *mounts.args(gw.api, "origin/" + DS, d, state)],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, STRATA_LOG="info"))
        m = Mount(d, state, r)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{m.log()}"
        assert mounted(d), m.log()
        entry = [line.split() for line in open("/proc/mounts") if line.split()[1] == d][0]
        assert entry[2] == "fuse.strata" and "user_id=65534" in entry[3] and "ro" in entry[3].split(","), entry
        assert entry[0] == "strata:origin/" + DS, entry
        holders, servers = m.procs()
        assert holders and servers and all(os.stat(f"/proc/{p}").st_uid == 65534 for p in holders + servers)
        # nobody reads every file byte-exact; the kernel lets no one else in (no allow_other).
        listing = _as_nobody("sh", "-c", f"cd {d} && find . -type f -print0 | sort -z | xargs -0 sha256sum")
        assert listing.returncode == 0, listing.stderr
        want = sorted(f"{sha(b)}  ./{k}" for k, b in dataset["files"].items())
        assert sorted(listing.stdout.decode().splitlines()) == want
        assert _as_nobody("cat", m.path(BIG[0])).stdout == dataset["files"][BIG[0]]
        # kill -9 of the server: nobody's holder starts another, the mount stays.
        os.kill(m.server(), signal.SIGKILL)
        wait_for(lambda: m.procs()[1] and m.procs()[1] != servers, 30, "a new server")
        assert _as_nobody("cat", m.path(BIG[1])).stdout == dataset["files"][BIG[1]]
        # SIGTERM to the holder: unmounted with fusermount3, the processes gone.
        holders, servers = m.procs()
        os.kill(holders[0], signal.SIGTERM)
        wait_for(lambda: not mounted(d), 30, "the user's mount to go")
        wait_for(lambda: not any(alive(p) for p in holders + m.procs()[1]), 15, "the holder and server to exit")
        # And again, unmounted by the user with fusermount3 -u.
        r = subprocess.run(["runuser", "-u", "nobody", "--", *mounts.args(gw.api, "origin/" + DS, d, state)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and mounted(d), r.stderr
        assert _as_nobody("fusermount3", "-u", d).returncode == 0
        wait_for(lambda: not mounted(d) and m.procs() == ([], []), 30, "the mount and its processes to go")
    finally:
        os.chmod("/dev/fuse", dev_mode)
        mounts.cleanup()
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# 11. A caller that may not read the location


def _api(gw, method, path, body=None, token=ADMIN_TOKEN):
    req = urllib.request.Request(gw.api + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _nothing_mounted(m):
    assert not mounted(m.dir), m.log()
    assert os.listdir(m.dir) == []
    assert m.procs() == ([], []), m.procs()


def test_a_token_that_may_not_read_the_location_mounts_nothing(gw, s3, mounts):
    put_all(s3, {"mnt-owned/secret.bin": b"audio's", "mnt-open/ok.bin": b"anyone's"})
    for t in ("audio", "vision"):
        _api(gw, "POST", "/v1/teams", {"name": t})
    s, v = _api(gw, "PUT", "/v1/prefixes", {"backend": "origin", "prefix": "mnt-owned/", "team": "audio"})
    assert s == 200, (s, v)
    s, v = _api(gw, "POST", "/v1/tokens", {"name": "mnt-vision-member", "kind": "token", "team": "vision",
                                           "role": "member"})
    assert s == 200, (s, v)
    member = v["token"]
    m = mounts.mount(gw.api, "origin/mnt-owned/", token=member, check=False)
    err = (m.result.stdout + m.result.stderr).lower()
    assert m.result.returncode != 0, (m.result.stdout, m.result.stderr)
    # The agent's refusal, passed on: whose the location is, and that the caller may not read it.
    assert "403" in err and "not a reader" in err and 'team "audio"' in err, m.result.stderr
    _nothing_mounted(m)
    # The same token mounts what it may read.
    ok = mounts.mount(gw.api, "origin/mnt-open/", token=member)
    with open(ok.path("ok.bin"), "rb") as f:
        assert f.read() == b"anyone's"
    # Issue 44, finding 5: the long-lived holder and its server keep the token out of their command lines
    # (`/proc/<pid>/cmdline` is readable by every user of the node).
    holders, servers = ok.procs()
    assert holders and servers, (holders, servers)
    for pid in holders + servers:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert member.encode() not in f.read(), pid
    # A token the agent does not know.
    m = mounts.mount(gw.api, "origin/mnt-open/", token="not-a-token-0123456789", check=False)
    err = (m.result.stdout + m.result.stderr).lower()
    assert m.result.returncode != 0, (m.result.stdout, m.result.stderr)
    assert "unauthenticated" in err or "401" in err or "token" in err, m.result.stderr
    _nothing_mounted(m)


# ---------------------------------------------------------------------------------------------------------------
# 12. Bad input


def test_bad_mount_points_an_empty_location_and_a_hidden_directory_are_refused(gw, s3, mounts, tmp_path):
    missing = str(tmp_path / "no-such-dir")
    r = subprocess.run([STRATA, "mount", "origin/" + DS, missing, "--api", gw.api,
                        "--state-dir", str(tmp_path / "st-missing")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no-such-dir" in r.stderr and "No such file" in r.stderr, r.stderr
    assert not os.path.exists(missing)
    afile = tmp_path / "a-file"
    afile.write_text("x")
    r = subprocess.run([STRATA, "mount", "origin/" + DS, str(afile), "--api", gw.api,
                        "--state-dir", str(tmp_path / "st-file")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not a directory" in r.stderr, r.stderr
    assert not mounted(str(afile))
    # A bad mode is refused before anything happens.
    m = mounts.mount(gw.api, "origin/" + DS, "--mode", "0999", check=False)
    assert m.result.returncode != 0 and "octal" in m.result.stderr, m.result.stderr
    assert not mounted(m.dir)
    # A location with nothing under it is refused (a job must not start on nothing), with a hint when the
    # location names an object rather than a prefix.
    m = mounts.mount(gw.api, "origin/mnt-nothing-here/", check=False)
    assert m.result.returncode != 0 and "nothing to mount" in m.result.stderr, m.result.stderr
    assert not mounted(m.dir)
    one = sorted(k for k in origin_listing(s3, DS) if not k.endswith("/"))[0]
    m = mounts.mount(gw.api, "origin/" + one, check=False)
    assert m.result.returncode != 0 and "mount the prefix" in m.result.stderr, m.result.stderr
    assert not mounted(m.dir)
    # A mount point that is not empty, or is mounted on already, is refused: nothing is hidden.
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("mine")
    m = mounts.mount(gw.api, "origin/" + DS, d=str(full), check=False)
    assert m.result.returncode != 0 and "not empty" in m.result.stderr, m.result.stderr
    assert not mounted(str(full)) and (full / "mine.txt").read_text() == "mine"
    m1 = mounts.mount(gw.api, "origin/" + DS)
    m2 = mounts.mount(gw.api, "origin/" + DS, d=m1.dir, check=False)
    assert m2.result.returncode != 0, m2.result.stderr