"""The S3 gateway against rclone and the aws cli moving whole trees of files with ugly names: every printable
ASCII character a file name can hold, unicode (NFC and NFD, CJK, emoji, right-to-left, invisible), long names,
nested directories; sizes from 0 bytes to above both clients' multipart cutoffs (names of 253 to 255 bytes and
backslashes have their own tests). Both bucket kinds: `default` (a local directory) and `origin` (an S3 bucket
on moto). Every transfer is checked byte-exact, every listing key by key, and rclone's check must really compare
MD5s (a multipart object's through the X-Amz-Meta-Md5chksum rclone stores with it).

rclone (Debian's package; scripts/test.sh installs it) is configured from the environment only, with
`--config /dev/null`; without it on PATH its tests are skipped, and STRATA_REQUIRE_RCLONE=1 makes that an error.
"""
import base64
import filecmp
import hashlib
import json
import os
import random
import shutil
import subprocess
import time

import pytest

from conftest import ACCESS_KEY, SECRET_KEY, VENV_BIN

BUCKETS = ["default", "origin"]
RCLONE = shutil.which("rclone")
if RCLONE is None and os.environ.get("STRATA_REQUIRE_RCLONE") == "1":
    raise RuntimeError("STRATA_REQUIRE_RCLONE=1 and rclone is not on PATH")
needs_rclone = pytest.mark.skipif(RCLONE is None, reason="rclone is not installed (scripts/test.sh installs it)")
MiB = 1024 * 1024
# rclone uploads files of 5 MiB and more in 5 MiB parts; the aws cli, 8 MiB and more in 8 MiB parts.
RCLONE_FLAGS = ["--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M",
                # Fail fast: a refused request must fail the test, not be retried for minutes.
                "--retries", "1", "--low-level-retries", "2", "--contimeout", "10s", "--timeout", "60s"]

# Every printable ASCII character a file name can hold ('/' cannot; '\\' has its own test below).
PRINTABLE = [c for c in map(chr, range(32, 127)) if c not in "/\\"]
ODD = ["a%2Fb", "c%20d", "e%25f", "%", "%%", "%zz", "a+b c", "+", "++", "&amp;", "<x>&\"'", "?q=1&r=2", "#frag",
       "version#1", "v#12", "x;y,z=@$", "[br]{ce}", "(p)!*'", "`tick`", "^caret|pipe", ":colon", "~tilde",
       ".hidden", "..dots", "...", " lead space", "trail space ", "-dash", "trail.", "é", "é.txt", "日本語.bin",
       "emoji 😀🎉.dat", "e\u0301-nfd", "Ω≈ç√∫", "שלום", "ÅÄÖ åäö", "中文 空格", "\u00a0nbsp", "zero\u200bwidth",
       "L" * 200 + ".bin", "é" * 100]
DIRS = ["d+plus", "d%25", "d #", "d space/deeper", "日本/ファイル", "emoji 🎉", "a/b/c/d/e", "[brackets]/(parens)",
        "x=y;z", ".dot", "dir#7", "d&amp;", "é" * 90 + "/" + "ü" * 100]
# Above rclone's cutoff (exactly one 5 MiB part), above the aws cli's (exactly one 8 MiB part), above both.
BIG = {"big 5MiB é+%20.bin": 5 * MiB, "big 8MiB [x]#1 & = ;.bin": 8 * MiB,
       "d space/deeper/big 9.5MiB 日本 +%.bin": 9 * MiB + MiB // 2 + 3}


def small_size(rng):
    r = rng.random()
    if r < 0.1:
        return 0
    if r < 0.4:
        return rng.randint(1, 100)
    if r < 0.8:
        return rng.randint(100, 8 * 1024)
    return rng.randint(8 * 1024, 200 * 1024)


def ugly_tree(root, seed=1):
    """Writes the tree under `root`: ~300 files, ~29 MiB. Returns {relative path: bytes}."""
    rng = random.Random(seed)
    files = {}
    for c in PRINTABLE:
        files[f"k{c}v"] = small_size(rng)
    for n in ODD:
        files[n] = small_size(rng)
    names = [f"k{c}v" for c in PRINTABLE] + ODD
    for i, d in enumerate(DIRS):
        for n in names[i * 11 % len(names):][:12]:
            files[f"{d}/{n}"] = small_size(rng)
    files.update(BIG)
    out = {}
    for rel, size in files.items():
        out[rel] = write(root, rel, rng.randbytes(size))
    return out


def write(root, rel, data):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data)
    return data


def local_files(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = p
    return out


def assert_same_tree(got, want):
    """Same relative paths, byte for byte (never filecmp's shallow size-and-mtime look)."""
    g, w = local_files(got), local_files(want)
    assert sorted(g) == sorted(w), (sorted(set(w) - set(g))[:10], sorted(set(g) - set(w))[:10])
    differ = [r for r in w if not filecmp.cmp(g[r], w[r], shallow=False)]
    assert not differ, differ[:10]


def md5(data):
    return hashlib.md5(data).hexdigest()


def listing(gateway, bucket, prefix):
    """{key without the prefix: (size, ETag)} from the gateway's ListObjectsV2, paged."""
    s3 = gateway.client()
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix,
                                                             PaginationConfig={"PageSize": 97}):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = (o["Size"], o["ETag"].strip('"'))
    return out


def assert_listed(gateway, bucket, prefix, files):
    """The gateway lists exactly these keys, with their sizes; single-part ETags are the content's MD5."""
    got = listing(gateway, bucket, prefix)
    assert sorted(got) == sorted(files), (sorted(set(files) - set(got))[:10], sorted(set(got) - set(files))[:10])
    for rel, data in files.items():
        size, etag = got[rel]
        assert size == len(data), rel
        assert "-" in etag or etag == md5(data), (rel, etag)


def delete_prefix(gateway, bucket, prefix):
    s3 = gateway.client()
    keys = list(listing(gateway, bucket, prefix))
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": prefix + k} for k in keys[i:i + 1000]]})
    assert not listing(gateway, bucket, prefix)


def modify(root, files, rng):
    """Changes the tree the way a second run of a job does: rewrites some files (same size, and another
    size; big ones too), deletes some (a whole directory's), adds some. Returns (changed, added, deleted)."""
    later = time.time() + 60  # strictly newer than anything the gateway stamped (both clients compare times)
    gone = sorted(r for r in files if r.startswith("x=y;z/"))  # the whole directory goes
    small = sorted(r for r, d in files.items() if len(d) > 0 and r not in BIG and r not in gone)
    changed = rng.sample(small, 8) + ["big 5MiB é+%20.bin"]
    for i, rel in enumerate(changed):
        n = len(files[rel]) if i % 2 == 0 else len(files[rel]) + 17
        files[rel] = write(root, rel, rng.randbytes(n))
        os.utime(os.path.join(root, rel), (later, later))
    deleted = sorted(gone + rng.sample(sorted(set(small) - set(changed)), 6))
    for rel in deleted:
        os.remove(os.path.join(root, rel))
        del files[rel]
    os.rmdir(os.path.join(root, "x=y;z"))
    added = ["new/k+v", "new/a%2Fb c", "new/日本 😀", "d+plus/added #1", "k v added", "new/big 6MiB +%&.bin"]
    for rel in added:
        files[rel] = write(root, rel, rng.randbytes(6 * MiB + 1 if "6MiB" in rel else small_size(rng)))
    return sorted(changed), sorted(added), sorted(deleted)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """The ugly tree, written once; tests that change it copy it first."""
    root = tmp_path_factory.mktemp("ugly") / "src"
    files = ugly_tree(str(root))
    return root, files


def copy_tree(tree, dst):
    root, files = tree
    shutil.copytree(root, dst)
    return dst, dict(files)


# ---------------------------------------------------------------------------------------------------- rclone


def rclone_env(gateway, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    # AWS_CA_BUNDLE in the environment makes rclone's S3 backend refuse to start ("LoadCustomCABundleError").
    env.update(RCLONE_CONFIG_GW_TYPE="s3", RCLONE_CONFIG_GW_PROVIDER="Other",
               RCLONE_CONFIG_GW_ACCESS_KEY_ID=ACCESS_KEY, RCLONE_CONFIG_GW_SECRET_ACCESS_KEY=SECRET_KEY,
               RCLONE_CONFIG_GW_ENDPOINT=gateway.endpoint, RCLONE_CONFIG_GW_REGION="us-east-1",
               RCLONE_CONFIG_GW_FORCE_PATH_STYLE="true", RCLONE_CACHE_DIR=str(tmp_path / "rclone-cache"))
    return env


class Rclone:
    def __init__(self, gateway, tmp_path):
        self.env = rclone_env(gateway, tmp_path)

    def __call__(self, *args, ok=True):
        """Runs rclone with a JSON log; returns (returncode, [log records], stdout)."""
        r = subprocess.run([RCLONE, "--config", "/dev/null", "-v", "--use-json-log", *RCLONE_FLAGS, *args],
                           env=self.env, capture_output=True, text=True, timeout=300)
        log = []
        for line in r.stderr.splitlines():
            try:
                log.append(json.loads(line))
            except ValueError:
                log.append({"level": "raw", "msg": line})
        if ok:
            assert r.returncode == 0, f"rclone {' '.join(args)} exited {r.returncode}:\n" + "\n".join(
                f"{x.get('level')}: {x.get('object', '')}: {x.get('msg')}" for x in log
                if x.get("level") in ("error", "raw", "warning", "critical"))[-4000:]
        return r.returncode, log, r.stdout

    def acted(self, log, *msgs):
        """The files rclone logged one of these messages for ("Copied (new)", "Deleted", ...)."""
        return sorted(x["object"] for x in log if x.get("msg") in msgs and "object" in x)

    def check(self, src, dst, n):
        """`rclone check`: no difference, every one of the n files compared by MD5 (none 'could not be
        checked', a common hash found)."""
        rc, log, _ = self("check", src, dst, ok=False)
        msgs = [x.get("msg", "") for x in log]
        detail = "\n".join(f"{x.get('level')}: {x.get('object', '')}: {x.get('msg')}" for x in log)[-4000:]
        assert rc == 0, detail
        assert "0 differences found" in msgs, detail
        assert f"{n} matching files" in msgs, detail
        assert not any("could not be checked" in m or "No common hash" in m or "not using a hash" in m
                       for m in msgs), detail

    def hashes(self, remote, *flags):
        """{path: (size, md5)} of every file under remote, as rclone lists and hashes them."""
        _, _, out = self("lsjson", "-R", "--files-only", "--hash", "--hash-type", "MD5", *flags, remote)
        return {x["Path"]: (x["Size"], x.get("Hashes", {}).get("md5", "")) for x in json.loads(out)}


@needs_rclone
@pytest.mark.parametrize("bucket", BUCKETS)
def test_rclone_copy_check_sync_and_copy_back_an_ugly_tree(gateway, bucket, tree, tmp_path):
    """rclone copies the tree up (multipart above 5 MiB), lists it under exactly its names, hashes every file
    with MD5 (a multipart one through X-Amz-Meta-Md5chksum) and `check` compares them all; a second copy moves
    nothing (sizes, modification times and hashes survive); a sync after changes copies, replaces and deletes
    exactly what changed; a server-side copy keeps the bytes; and copied back, the tree is byte-exact."""
    rclone = Rclone(gateway, tmp_path)
    src, files = copy_tree(tree, tmp_path / "src")
    prefix = f"rclone-{bucket}/"
    remote = f"gw:{bucket}/{prefix[:-1]}"
    _, log, _ = rclone("copy", str(src), remote)
    assert rclone.acted(log, "Copied (new)") == sorted(files)
    assert_listed(gateway, bucket, prefix, files)
    want = {r: (len(d), md5(d)) for r, d in files.items()}
    assert rclone.hashes(remote) == want
    s3 = gateway.client()
    for rel in BIG:  # multipart: rclone's hash is the metadata it sent, and the gateway keeps it
        meta = s3.head_object(Bucket=bucket, Key=prefix + rel)["Metadata"]
        assert meta.get("md5chksum") == base64.b64encode(hashlib.md5(files[rel]).digest()).decode(), (rel, meta)
    # ListObjectsV2 with url-encoded keys, as rclone does for AWS itself, lists and hashes the same
    assert rclone.hashes(remote, "--s3-list-version", "2", "--s3-list-url-encode", "true") == want
    rclone.check(str(src), remote, len(files))
    _, log, _ = rclone("copy", str(src), remote)
    assert rclone.acted(log, "Copied (new)", "Copied (replaced existing)",
                        "Updated modification time in destination") == []

    changed, added, deleted = modify(str(src), files, random.Random(2))
    _, log, _ = rclone("sync", str(src), remote)
    assert rclone.acted(log, "Copied (replaced existing)") == changed
    assert rclone.acted(log, "Copied (new)") == added
    assert rclone.acted(log, "Deleted") == deleted
    assert_listed(gateway, bucket, prefix, files)
    assert rclone.hashes(remote) == {r: (len(d), md5(d)) for r, d in files.items()}
    rclone.check(str(src), remote, len(files))

    # server-side copies (CopyObject, the key url-encoded in x-amz-copy-source), a multipart object among them
    sub = "d space"
    _, log, _ = rclone("copy", f"{remote}/{sub}", f"gw:{bucket}/rclone-ssc-{bucket}/{sub}")
    inside = sorted(r[len(sub) + 1:] for r in files if r.startswith(sub + "/"))
    assert rclone.acted(log, "Copied (server-side copy)") == inside
    rclone.check(str(src / sub), f"gw:{bucket}/rclone-ssc-{bucket}/{sub}", len(inside))

    for run in ("cold", "hot"):
        back = tmp_path / f"back-{run}"
        rclone("copy", remote, str(back))
        assert_same_tree(back, src)
    rclone("purge", f"gw:{bucket}/rclone-ssc-{bucket}")
    rclone("purge", remote)
    assert not listing(gateway, bucket, prefix)


@needs_rclone
@pytest.mark.parametrize("bucket", BUCKETS)
def test_rclone_rcat_streams_input_of_unknown_size(gateway, bucket, tmp_path):
    """`rclone rcat` of more than its streaming cutoff does not know the size: it uploads 5 MiB parts as they
    fill; under the cutoff it buffers and PUTs. Both under ugly keys, read back byte-exact with `rclone cat`."""
    rclone = Rclone(gateway, tmp_path)
    rng = random.Random(3)
    for name, n in (("streamed +%20 é 😀 #1.bin", 11 * MiB + 5), ("small &=;@ [x].txt", 5000)):
        data = rng.randbytes(n)
        remote = f"gw:{bucket}/rcat-{bucket}/{name}"
        # --s3-no-check-bucket: no CreateBucket first (that is test_rclone_writes_single_files_...'s)
        r = subprocess.run([RCLONE, "--config", "/dev/null", *RCLONE_FLAGS, "--s3-no-check-bucket", "rcat", remote],
                           input=data, env=rclone.env, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        r = subprocess.run([RCLONE, "--config", "/dev/null", *RCLONE_FLAGS, "cat", remote],
                           env=rclone.env, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        assert r.stdout == data, name
        got = gateway.client().get_object(Bucket=bucket, Key=f"rcat-{bucket}/{name}")["Body"].read()
        assert md5(got) == md5(data), name
    rclone("purge", f"gw:{bucket}/rcat-{bucket}")
    assert not listing(gateway, bucket, f"rcat-{bucket}/")


def s3_multipart_etag(data, part):
    """S3's ETag of an object uploaded in `part`-byte parts: the MD5 of the parts' MD5s, and their count."""
    parts = [data[i:i + part] for i in range(0, len(data), part)] or [b""]
    return hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + f"-{len(parts)}"


@needs_rclone
@pytest.mark.parametrize("bucket", BUCKETS)
def test_rclone_gets_the_multipart_etag_s3_gives(gateway, bucket, tmp_path):
    """A multipart upload's ETag is S3's, the MD5 of the client's parts' MD5s and their count: rclone checks it
    after each upload (`--s3-use-multipart-etag`, its default for AWS, Minio, Ceph and most providers, not for
    Other) and fails the copy with 'multipart upload corrupted: Etag differ' otherwise."""
    rclone = Rclone(gateway, tmp_path)
    src = tmp_path / "src"
    rng = random.Random(6)
    files = {rel: write(str(src), rel, rng.randbytes(n)) for rel, n in BIG.items()}
    prefix = f"mpetag-rclone-{bucket}/"
    rclone("copy", "--s3-use-multipart-etag", "true", str(src), f"gw:{bucket}/{prefix[:-1]}")
    got = listing(gateway, bucket, prefix)
    assert {r: got[r][1] for r in files} == {r: s3_multipart_etag(d, 5 * MiB) for r, d in files.items()}
    rclone.check(str(src), f"gw:{bucket}/{prefix[:-1]}", len(files))
    delete_prefix(gateway, bucket, prefix)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_aws_cli_gets_the_multipart_etag_s3_gives(gateway, bucket, tmp_path):
    """The aws cli sends files of 8 MiB and more in 8 MiB parts, smaller ones in one PUT: the objects list with
    S3's ETags for those (the MD5 of the parts' MD5s and their count; the MD5)."""
    src = tmp_path / "src"
    rng = random.Random(7)
    files = {rel: write(str(src), rel, rng.randbytes(n)) for rel, n in BIG.items()}
    prefix = f"mpetag-aws-{bucket}/"
    aws(gateway, "cp", "--recursive", str(src), f"s3://{bucket}/{prefix}", cwd=tmp_path)
    got = listing(gateway, bucket, prefix)
    assert {r: got[r][1] for r in files} == {
        r: s3_multipart_etag(d, 8 * MiB) if len(d) >= 8 * MiB else md5(d) for r, d in files.items()}
    delete_prefix(gateway, bucket, prefix)


@needs_rclone
@pytest.mark.parametrize("bucket", BUCKETS)
def test_rclone_writes_single_files_into_a_bucket_it_has_not_listed(gateway, bucket, tmp_path):
    """Before writing into a bucket it has not listed, rclone creates it (CreateBucket), as S3 allows for a
    bucket one already owns (200, or 409 BucketAlreadyOwnedByYou, which rclone takes as success): `copyto`,
    `copy` of one file, `rcat`, `mkdir`, `touch` must not fail on that answer."""
    rclone = Rclone(gateway, tmp_path)
    f = tmp_path / "one +%20 é.txt"
    f.write_bytes(b"single file")
    base = f"gw:{bucket}/single-{bucket}"
    rclone("copyto", str(f), f"{base}/copyto &= #1.txt")
    rclone("copy", str(f), f"{base}/dir [x]")
    r = subprocess.run([RCLONE, "--config", "/dev/null", *RCLONE_FLAGS, "rcat", f"{base}/rcat ;@.txt"],
                       input=b"from stdin", env=rclone.env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    rclone("mkdir", f"{base}/made")
    rclone("touch", f"{base}/touched")
    s3 = gateway.client()
    want = {"copyto &= #1.txt": b"single file", "dir [x]/one +%20 é.txt": b"single file",
            "rcat ;@.txt": b"from stdin", "touched": b""}
    assert sorted(listing(gateway, bucket, f"single-{bucket}/")) == sorted(want)
    for rel, data in want.items():
        assert s3.get_object(Bucket=bucket, Key=f"single-{bucket}/{rel}")["Body"].read() == data, rel
    delete_prefix(gateway, bucket, f"single-{bucket}/")


# --------------------------------------------------------------------------------------------------- aws cli


def aws_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BOTO_"))}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_MAX_ATTEMPTS="2")  # fail fast, as rclone's flags
    env.update(extra)
    return env


def aws(gateway, *args, cwd, env=None):
    """Runs `aws s3 ...` in `cwd`; returns its output lines."""
    r = subprocess.run([os.path.join(VENV_BIN, "aws"), "--endpoint-url", gateway.endpoint, "s3", *args,
                        "--no-progress"], env=env or aws_env(), cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"aws s3 {' '.join(args)} exited {r.returncode}:\n{r.stderr[-4000:]}"
    return r.stdout.splitlines()


def acted(lines, verb, root, cwd):
    """The paths relative to `root` (a local directory or an s3:// URL) that `aws s3` run in `cwd` reports for
    `verb` (upload, download, delete; it names local files relative to `cwd`)."""
    out = []
    for line in lines:
        if not line.startswith(verb + ": "):
            continue
        rest = line[len(verb) + 2:]
        if verb == "delete":
            path = rest
        else:
            src, _, dst = rest.rpartition(" to ")
            path = dst if verb == "download" else src
        root = str(root)
        if root.startswith("s3://"):
            assert path.startswith(root), (line, root)
            out.append(path[len(root):])
        else:
            out.append(os.path.relpath(os.path.join(cwd, path), root))
    return sorted(out)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_aws_cli_sync_an_ugly_tree_both_ways(gateway, bucket, tree, tmp_path):
    """`aws s3 sync` up (multipart above 8 MiB), listed under exactly its names; down, byte-exact, cold and from
    the cache; again both ways, nothing moves; after changes `sync --delete` uploads and deletes exactly what
    changed, and down again with --delete the copy follows."""
    src, files = copy_tree(tree, tmp_path / "src")
    prefix = f"awssync-{bucket}/"
    url = f"s3://{bucket}/{prefix}"
    down = tmp_path / "down"

    def sync(a, b, *flags):
        return aws(gateway, "sync", *flags, str(a), str(b), cwd=tmp_path)

    assert acted(sync(src, url), "upload", src, tmp_path) == sorted(files)
    assert_listed(gateway, bucket, prefix, files)
    assert acted(sync(url, down), "download", down, tmp_path) == sorted(files)
    assert_same_tree(down, src)
    assert sync(src, url) == []
    assert sync(url, down) == []
    shutil.rmtree(down)
    sync(url, down)  # from the cache
    assert_same_tree(down, src)

    changed, added, deleted = modify(str(src), files, random.Random(5))
    lines = sync(src, url, "--delete")
    assert acted(lines, "upload", src, tmp_path) == sorted(changed + added)
    assert acted(lines, "delete", url, tmp_path) == deleted
    assert_listed(gateway, bucket, prefix, files)
    lines = sync(url, down, "--delete", "--exact-timestamps")
    assert acted(lines, "delete", down, tmp_path) == deleted
    assert set(acted(lines, "download", down, tmp_path)) >= set(changed + added)
    assert_same_tree(down, src)
    delete_prefix(gateway, bucket, prefix)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_aws_cli_cp_recursive_an_ugly_tree_both_ways(gateway, bucket, tree, tmp_path):
    """`aws s3 cp --recursive` up and down: exactly the tree's keys, byte-exact back."""
    src, files = tree
    prefix = f"awscp-{bucket}/"
    url = f"s3://{bucket}/{prefix}"
    down = tmp_path / "down"
    lines = aws(gateway, "cp", "--recursive", str(src), url, cwd=tmp_path)
    assert acted(lines, "upload", src, tmp_path) == sorted(files)
    assert_listed(gateway, bucket, prefix, files)
    lines = aws(gateway, "cp", "--recursive", url, str(down), cwd=tmp_path)
    assert acted(lines, "download", down, tmp_path) == sorted(files)
    assert_same_tree(down, src)
    delete_prefix(gateway, bucket, prefix)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_aws_cli_uploads_empty_files_without_stalling(gateway, bucket, tmp_path):
    """The aws cli PUTs every file, an empty one too, with `Expect: 100-continue` and waits for the 100 before
    it sends the body. S3 (and moto) answer 100 Continue then 200; answered 200 at once, botocore keeps that
    status line for the connection, so the next upload on it reads its own answer as headers and waits for its
    read timeout (60 s by default) before it retries. One connection, an empty file, then two more."""
    src = tmp_path / "src"
    files = {"a-empty": b"", "b-file": b"hello", "c-file +%20": b"more", "d-empty é": b"", "e-file": b"x" * 1000}
    for rel, data in files.items():
        write(str(src), rel, data)
    cfg = tmp_path / "aws.cfg"
    cfg.write_text("[default]\ns3 =\n  max_concurrent_requests = 1\n")
    env = aws_env(AWS_CONFIG_FILE=str(cfg))
    prefix = f"empty-{bucket}/"
    t = time.monotonic()
    r = subprocess.run([os.path.join(VENV_BIN, "aws"), "--endpoint-url", gateway.endpoint, "--cli-read-timeout", "20",
                        "--debug", "s3", "cp", "--recursive", "--no-progress", str(src), f"s3://{bucket}/{prefix}"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    stalls = [line for line in r.stderr.splitlines() if "Read timeout" in line or "Failed to parse headers" in line]
    assert not stalls, (f"{took:.1f}s", stalls[:4])
    assert_listed(gateway, bucket, prefix, files)
    delete_prefix(gateway, bucket, prefix)


# ------------------------------------------------------------------------- names the big tree does not hold


@pytest.mark.parametrize("bucket", BUCKETS)
def test_file_names_of_up_to_255_bytes_are_stored(gateway, bucket, tmp_path):
    """A Linux file name is up to 255 bytes: the aws cli and rclone upload such names, one-byte and multibyte,
    nested, and as directories; they read back byte-exact (rclone downloads them again; the aws cli cannot,
    for it writes `<name>.<8 characters>` first, over the limit: those are read with boto3)."""
    src = tmp_path / "src"
    files = {}
    for n in (246, 253, 254, 255):
        files["L" * n] = b"ascii %d" % n
        files["d/" + "é" * (n // 2) + "x" * (n % 2)] = b"two-byte %d" % n
        files["D" * n + "/" + "日" * (n // 3) + "x" * (n % 3)] = b"dir %d" % n
    for rel, data in files.items():
        write(str(src), rel, data)
    s3 = gateway.client()
    prefix = f"long-aws-{bucket}/"
    aws(gateway, "cp", "--recursive", str(src), f"s3://{bucket}/{prefix}", cwd=tmp_path)
    assert_listed(gateway, bucket, prefix, files)
    for rel, data in files.items():
        assert s3.get_object(Bucket=bucket, Key=prefix + rel)["Body"].read() == data, len(rel)
    delete_prefix(gateway, bucket, prefix)
    if RCLONE is None:
        return
    rclone = Rclone(gateway, tmp_path)
    prefix = f"long-rclone-{bucket}/"
    rclone("copy", str(src), f"gw:{bucket}/{prefix[:-1]}")
    assert_listed(gateway, bucket, prefix, files)
    rclone.check(str(src), f"gw:{bucket}/{prefix[:-1]}", len(files))
    rclone("copy", f"gw:{bucket}/{prefix[:-1]}", str(tmp_path / "back"))
    assert_same_tree(tmp_path / "back", src)
    delete_prefix(gateway, bucket, prefix)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_a_backslash_in_a_file_name_is_an_ordinary_character(gateway, bucket, tmp_path):
    """A backslash is an ordinary character in a Linux file name and in an S3 key: rclone and the aws cli upload
    `a\\b` as the key `a\\b` (single PUT and multipart), and it comes back as the file `a\\b`."""
    src = tmp_path / "src"
    files = {"back\\slash": b"one", "d\\ir/x": b"two", "\\": b"three",
             "big \\ 9MiB.bin": random.Random(4).randbytes(9 * MiB)}
    for rel, data in files.items():
        write(str(src), rel, data)
    clients = [("aws", f"bs-aws-{bucket}/")]
    if RCLONE is not None:
        clients.append(("rclone", f"bs-rclone-{bucket}/"))
    for name, prefix in clients:
        back = tmp_path / f"back-{name}"
        if name == "aws":
            aws(gateway, "cp", "--recursive", str(src), f"s3://{bucket}/{prefix}", cwd=tmp_path)
        else:
            Rclone(gateway, tmp_path)("copy", str(src), f"gw:{bucket}/{prefix[:-1]}")
        assert_listed(gateway, bucket, prefix, files)
        if name == "aws":
            aws(gateway, "cp", "--recursive", f"s3://{bucket}/{prefix}", str(back), cwd=tmp_path)
        else:
            rclone = Rclone(gateway, tmp_path)
            rclone.check(str(src), f"gw:{bucket}/{prefix[:-1]}", len(files))
            rclone("copy", f"gw:{bucket}/{prefix[:-1]}", str(back))
        assert_same_tree(back, src)
        delete_prefix(gateway, bucket, prefix)
