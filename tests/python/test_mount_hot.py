"""Hot copies and FUSE passthrough of `strata mount`: a large file read whole is kept as a local copy, and later
opens hand that copy to the kernel as the backing file, so reads (and mmap) no longer go through the server.

Covered: the copy appears only once the whole file was read, byte-exact, and a passthrough read works with the
server stopped (SIGSTOP) and the page cache dropped, which a read through the server cannot; an inode held
open through the page cache keeps every later open there until it is closed (the kernel refuses the two modes
at once with EIO), also across a kill -9 of the server; passthrough handles keep working across a kill -9 and
the next server reuses their backing file; the budget (`--hot-size`) evicts the least recently opened copy,
`--hot-size 0` makes none, nor is a copy made that would leave its file system less than a tenth free; random
reads make no copy; a file's own pages are dropped once its copy serves it (cachestat(2)). Each test's copies
live on a tmpfs of its own (test_mount.Mounter.hot_dir), never on the machine's disk, however full.

Needs root (mount(2), the backing-file ioctls), /dev/fuse and Linux 6.9; skipped like test_mount.py.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from test_mount import (BIG, DS, MIB, _need_fuse, dataset, drop_caches, gw, mounts, s3,  # noqa: F401 (fixtures)
                        sha, sha_file, wait_for)

# Reads an inherited descriptor whole (read() and mmap) and prints both digests: no open, so no request to
# the mount's server is needed when the descriptor is a passthrough one.
READ_FD = r"""
import hashlib, mmap, os, sys
fd = int(sys.argv[1])
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
h = hashlib.sha256()
off = 0
while True:
    b = os.pread(fd, 1 << 20, off)
    if not b:
        break
    h.update(b)
    off += len(b)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
print(h.hexdigest(), hashlib.sha256(m[:]).hexdigest())
"""


def copies(mounts):
    """{name: size} of the complete hot copies of this test's mounts."""
    d = mounts.hot_dir()
    if not os.path.isdir(d):
        return {}
    return {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f != "tmp"}


def read_without_the_server(m, fd, timeout=30):
    """Digests (read, mmap) of descriptor `fd`, read by a child while the mount's server is stopped; None when
    the child could not finish without the server (it is let go on, once the server runs again)."""
    server = m.server()
    os.kill(server, signal.SIGSTOP)
    child = subprocess.Popen([sys.executable, "-c", READ_FD, str(fd)], pass_fds=(fd,), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
        finished = True
    except subprocess.TimeoutExpired:
        finished = False
    finally:
        # A FUSE request the stopped server already took cannot be interrupted: run the server again first.
        os.kill(server, signal.SIGCONT)
    if not finished:
        child.communicate(timeout=120)
        return None
    assert child.returncode == 0, err
    return out.split()


def kill_server(m):
    old = m.server()
    os.kill(old, signal.SIGKILL)
    return wait_for(lambda: [p for p in m.procs()[1] if p != old], 30, "a new server")[0]


def test_a_file_read_whole_is_then_read_through_its_copy_without_the_server(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS, "--hot-size", "1GiB")
    want = sha(dataset["files"][BIG[0]])
    # Random reads first (none in the first 8 MiB chunk, so none starts a sequential run): no copy.
    with open(m.path(BIG[0]), "rb", buffering=0) as f:
        for off in (15 * MIB, 19 * MIB + 7, 11 * MIB):
            f.seek(off)
            assert f.read(4096) == dataset["files"][BIG[0]][off:off + 4096]
    time.sleep(0.5)
    assert copies(mounts) == {}, "random reads made a copy"
    # Opened while no copy exists: through the server, as before.
    fd = os.open(m.path(BIG[0]), os.O_RDONLY)
    try:
        assert read_without_the_server(m, fd, timeout=5) is None, "read without the server before any copy"
    finally:
        os.close(fd)
    assert sha_file(m.path(BIG[0])) == want
    wait_for(lambda: list(copies(mounts).values()) == [20 * MIB], 30, "the hot copy")
    name = next(iter(copies(mounts)))
    with open(os.path.join(mounts.hot_dir(), name), "rb") as f:
        assert sha(f.read()) == want, "the copy holds other bytes"
    assert oct(os.stat(mounts.hot_dir()).st_mode & 0o777) == "0o700"
    # Opened now (once the kernel told the server the earlier handles are released: that comes after close
    # returns): through the copy, so it reads with the server stopped and nothing in the page cache.
    fd = wait_for(lambda: _passthrough_fd(m, m.path(BIG[0]), want), 60, "a passthrough open")
    os.close(fd)
    assert sha_file(m.path(BIG[0])) == want
    assert "passthrough=true" in m.log(), m.log()[-3000:]


def test_an_inode_open_through_the_page_cache_is_not_also_opened_passthrough(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS, "--hot-size", "1GiB")
    body = dataset["files"][BIG[1]]
    want = sha(body)
    held = open(m.path(BIG[1]), "rb", buffering=0)  # a cached handle, held across the rest
    assert held.read(MIB) == body[:MIB]
    assert sha_file(m.path(BIG[1])) == want  # a second open reads it whole: the copy is made
    wait_for(lambda: list(copies(mounts).values()) == [len(body)], 30, "the hot copy")
    # The copy exists, but the inode is open through the page cache: later opens must stay there (the
    # kernel would fail a passthrough open with EIO), also when a new server answers them.
    assert sha_file(m.path(BIG[1])) == want
    kill_server(m)
    assert sha_file(m.path(BIG[1])) == want
    held.seek(5 * MIB)
    assert held.read(MIB) == body[5 * MIB:6 * MIB]
    held.close()
    # Closed: the next open goes through the copy, and stays readable across a kill -9.
    fd = wait_for(lambda: _passthrough_fd(m, m.path(BIG[1]), want), 60, "a passthrough open")
    try:
        kill_server(m)
        # The new server opens the same inode passthrough again with the same backing file.
        assert sha_file(m.path(BIG[1])) == want
        fd2 = os.open(m.path(BIG[1]), os.O_RDONLY)
        try:
            assert read_without_the_server(m, fd2) == [want, want], m.log()[-3000:]
        finally:
            os.close(fd2)
        assert read_without_the_server(m, fd) == [want, want], m.log()[-3000:]
    finally:
        os.close(fd)
    # Every handle released: the table the servers share is back to zero.
    table = os.path.join(m.state, "handles")
    wait_for(lambda: not any(open(table, "rb").read()), 30, "the handle table to empty")
    assert "EIO" not in m.log() and "a read failed" not in m.log(), m.log()[-3000:]


def cached_pages(fd):
    """Pages of `fd`'s file in the page cache (cachestat(2), Linux 6.5): for a FUSE file, the mount's own pages,
    not its backing file's."""
    import ctypes

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    class Stat(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]

    libc = ctypes.CDLL(None, use_errno=True)
    rng, st = Range(0, 0), Stat()
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(st), 0) != 0:
        raise OSError(ctypes.get_errno(), "cachestat")
    return st.cache


def test_a_files_pages_are_dropped_once_its_copy_serves_it(gw, dataset, mounts):
    # A passthrough open makes the kernel drop the file's own pages (the two may not coexist), one page at a
    # time, in the open: a quarter of the first pass through the copies (bench/RESULTS.md). The server
    # drops them before, once the copy is in place and no handle reads through the page cache.
    m = mounts.mount(gw.api, "origin/" + DS, "--hot-size", "1GiB")
    body = dataset["files"][BIG[0]]
    assert sha_file(m.path(BIG[0])) == sha(body)  # through the page cache: the copy is made
    wait_for(lambda: list(copies(mounts).values()) == [len(body)], 30, "the hot copy")
    table = os.path.join(m.state, "handles")
    wait_for(lambda: not any(open(table, "rb").read()), 30, "the cached handles to be released")
    # The copy removed (as by an eviction), an open goes through the page cache again, and shows its pages.
    for name in copies(mounts):
        os.remove(os.path.join(mounts.hot_dir(), name))

    def pages():
        fd = os.open(m.path(BIG[0]), os.O_RDONLY)
        try:
            return cached_pages(fd)
        finally:
            os.close(fd)
    wait_for(lambda: pages() == 0, 30, "the page cache of a file served by its copy to be dropped")
    assert sha_file(m.path(BIG[0])) == sha(body)
    assert "EIO" not in m.log() and "a read failed" not in m.log(), m.log()[-3000:]


def _passthrough_fd(m, path, want):
    """A descriptor of `path` that reads without the server (a passthrough open), or None."""
    fd = os.open(path, os.O_RDONLY)
    got = read_without_the_server(m, fd, timeout=10)
    if got == [want, want]:
        return fd
    os.close(fd)
    return None


def test_copies_stay_within_their_budget_and_size_0_makes_none(gw, dataset, mounts):
    m = mounts.mount(gw.api, "origin/" + DS, "--hot-size", "30MiB")
    for rel in BIG:
        assert sha_file(m.path(rel)) == sha(dataset["files"][rel])
        size = len(dataset["files"][rel])
        wait_for(lambda: size in copies(mounts).values(), 30, f"the copy of {rel}")
    # 20 MiB + 20 MiB do not fit 30 MiB: the one opened least recently went.
    assert list(copies(mounts).values()) == [len(dataset["files"][BIG[1]])], copies(mounts)
    assert sum(copies(mounts).values()) <= 30 * MIB
    # The evicted file reads right (through the server, once the page cache is dropped) and is copied again,
    # evicting the other.
    drop_caches()
    assert sha_file(m.path(BIG[0])) == sha(dataset["files"][BIG[0]])
    wait_for(lambda: list(copies(mounts).values()) == [20 * MIB], 30, "the copy of big/one.bin again")

    m0 = mounts.mount(gw.api, "origin/" + DS, "--hot-dir", mounts.hot_dir() + "-none", "--hot-size", "0")
    for rel in BIG:
        assert sha_file(m0.path(rel)) == sha(dataset["files"][rel])
    time.sleep(1)
    assert not os.path.exists(mounts.hot_dir() + "-none"), os.listdir(mounts.hot_dir() + "-none")
    assert "passthrough=false" in m0.log(), m0.log()[-2000:]

    # A copy that would leave its file system less than a tenth free is not made, and the log says why.
    small = mounts.filesystem(os.path.join(mounts.base, "small"), "22m")
    m1 = mounts.mount(gw.api, "origin/" + DS, "--hot-dir", small, "--hot-size", "1GiB")
    assert sha_file(m1.path(BIG[0])) == sha(dataset["files"][BIG[0]])
    wait_for(lambda: "no hot copy: it would leave the file system" in m1.log(), 30, "the refusal in the log")
    assert [f for f in os.listdir(small) if f != "tmp"] == [] and os.listdir(os.path.join(small, "tmp")) == []
