"""Teams, tokens, quotas, attribution and clean-up end to end: `strata serve`, the operator CLI, and real S3
clients (boto3, the aws cli, s5cmd) against the gateway with keys issued by `strata token create --s3`."""
import glob
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import boto3
import botocore
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from conftest import ADMIN_TOKEN, JOB_KEY, JOB_SECRET, STRATA, VENV_BIN, Gateway, api_get

MIB = 1024 * 1024


def cli(gw, *args, token=ADMIN_TOKEN, check=True):
    r = subprocess.run([STRATA, *args], capture_output=True, text=True,
                       env=dict(os.environ, STRATA_API=gw.api, STRATA_TOKEN=token))
    if check and r.returncode != 0:
        raise AssertionError(f"strata {' '.join(args)}: {r.stdout}{r.stderr}")
    return r


def cli_json(gw, *args, token=ADMIN_TOKEN):
    return json.loads(cli(gw, *args, "--json", token=token).stdout)


def s3_for(gw, key):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=key["access_key"],
                        aws_secret_access_key=key["secret_key"], region_name="us-east-1",
                        config=Config(retries={"max_attempts": 3, "mode": "standard"}, s3={"addressing_style": "path"},
                                      max_pool_connections=32))


def code_of(e):
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(scope="module")
def tenancy(origin):
    gw = Gateway(origin)
    for t in ("vision", "nlp"):
        cli(gw, "team", "create", t)
    keys = {t: cli_json(gw, "token", "create", "--name", f"{t}-loader", "--team", t, "--s3") for t in ("vision", "nlp")}
    admin_v = cli_json(gw, "token", "create", "--name", "vision-admin", "--team", "vision", "--role", "team_admin")
    cli(gw, "prefix", "own", "default", "vision", "vision")
    cli(gw, "prefix", "own", "default", "nlp", "nlp")
    yield gw, keys, admin_v["token"]
    gw.close()


def used(gw, team, scope="default"):
    for q in cli_json(gw, "quota", "show", team):
        if q["scope"] == scope:
            return q
    return {"used_bytes": 0, "used_objects": 0, "reserved_bytes": 0}


def test_sixteen_concurrent_writers_stop_at_the_hard_limit(tenancy):
    gw, keys, _ = tenancy
    hard = 40 * MIB
    cli(gw, "quota", "set", "nlp", "--scope", "default", "--hard-bytes", "40MiB")
    s3 = s3_for(gw, keys["nlp"])
    stored, refused, errors = [], [], []
    lock = threading.Lock()
    big = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=2)

    def writer(w):
        for i in range(12):
            key = f"nlp/race/w{w:02d}-{i:02d}"
            body = os.urandom(MIB if i % 3 else 6 * MIB)
            try:
                if len(body) > 5 * MIB:
                    import io
                    s3.upload_fileobj(io.BytesIO(body), "default", key, Config=big)
                else:
                    s3.put_object(Bucket="default", Key=key, Body=body)
                with lock:
                    stored.append((key, len(body)))
            except ClientError as e:
                with lock:
                    refused.append((key, code_of(e)))
            except Exception as e:  # boto3's transfer manager wraps errors
                with lock:
                    (refused if "QuotaExceeded" in str(e) else errors).append((key, str(e)))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert refused, "the hard limit was never reached"
    for key, c in refused:
        if isinstance(c, tuple):
            assert c == ("QuotaExceeded", 403), (key, c)
    q = used(gw, "nlp")
    total = sum(n for _, n in stored)
    assert q["used_bytes"] == total, (q, total)
    assert q["used_bytes"] <= hard
    assert q["reserved_bytes"] == 0
    assert q["used_objects"] == len(stored)
    # Nothing half-written: a refused key does not exist, a stored one reads back whole.
    for key, _ in refused[:10]:
        with pytest.raises(ClientError):
            s3.head_object(Bucket="default", Key=key)
    key, n = stored[0]
    assert len(s3.get_object(Bucket="default", Key=key)["Body"].read()) == n
    # The aws cli and s5cmd get the same S3 error.
    env = dict(os.environ, AWS_ACCESS_KEY_ID=keys["nlp"]["access_key"],
               AWS_SECRET_ACCESS_KEY=keys["nlp"]["secret_key"], AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1")
    src = os.path.join(gw.dir, "big.bin")
    with open(src, "wb") as f:
        f.write(os.urandom(hard))
    r = subprocess.run([os.path.join(VENV_BIN, "aws"), "--endpoint-url", gw.endpoint, "s3", "cp", src,
                        "s3://default/nlp/cli/big.bin"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "QuotaExceeded" in r.stderr, r.stderr
    r = subprocess.run([os.path.join(VENV_BIN, "s5cmd"), "--endpoint-url", gw.endpoint, "--retry-count", "0",
                        "cp", src, "s3://default/nlp/cli/big5.bin"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "QuotaExceeded" in (r.stdout + r.stderr), r.stdout + r.stderr
    assert used(gw, "nlp")["used_bytes"] == total
    # Deleting gives the bytes back.
    s3.delete_object(Bucket="default", Key=key)
    assert used(gw, "nlp")["used_bytes"] == total - n


def test_owned_prefixes_keep_teams_apart_and_usage_is_attributed(tenancy):
    gw, keys, _ = tenancy
    v, n = s3_for(gw, keys["vision"]), s3_for(gw, keys["nlp"])

    def tag_job(job):
        def add(request, **_):
            request.headers["x-strata-job"] = job
            request.headers["x-strata-dataset"] = "imagenet"
        return add

    v.meta.events.register("before-sign.s3.PutObject", tag_job("job-42"))
    v.put_object(Bucket="default", Key="vision/ds/a", Body=b"a" * 1000)
    v.put_object(Bucket="default", Key="vision/ds/b", Body=b"b" * 500)
    with pytest.raises(ClientError) as e:
        n.put_object(Bucket="default", Key="vision/ds/evil", Body=b"x")
    assert code_of(e.value) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        n.get_object(Bucket="default", Key="vision/ds/a")
    assert code_of(e.value) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as e:
        n.delete_object(Bucket="default", Key="vision/ds/a")
    assert code_of(e.value) == ("AccessDenied", 403)
    # Listings do not show another team's keys.
    listed = n.list_objects_v2(Bucket="default", Prefix="vision/")
    assert "Contents" not in listed, listed.get("Contents")
    top = n.list_objects_v2(Bucket="default", Delimiter="/")
    assert "vision/" not in [p["Prefix"] for p in top.get("CommonPrefixes", [])]
    mine = v.list_objects_v2(Bucket="default", Prefix="vision/ds/")
    assert [o["Key"] for o in mine["Contents"]] == ["vision/ds/a", "vision/ds/b"]
    # Look-alike prefix: vision-x/ is not vision/.
    n.put_object(Bucket="default", Key="vision-x/ok", Body=b"n")
    by_job = {l["group"]: l for l in cli_json(gw, "usage", "--by", "job")}
    assert by_job["job-42"]["bytes"] == 1500 and by_job["job-42"]["team"] == "vision"
    by_ds = {l["group"]: l for l in cli_json(gw, "usage", "--by", "dataset")}
    assert by_ds["imagenet"]["objects"] == 2
    by_prefix = {l["group"]: l for l in cli_json(gw, "usage", "--by", "prefix")}
    assert by_prefix["default:vision/"]["bytes"] == 1500
    # A team member sees its own team only.
    _, _, vision_admin = tenancy
    teams = [t["name"] for t in cli_json(gw, "team", "ls", token=vision_admin)]
    assert teams == ["vision"]
    r = cli(gw, "quota", "show", "nlp", token=vision_admin, check=False)
    assert r.returncode != 0 and "403" in r.stderr
    # Reconciliation finds what was written behind the gateway's back, and attributes it by prefix.
    os.makedirs(os.path.join(gw.mount, "vision", "behind"), exist_ok=True)
    with open(os.path.join(gw.mount, "vision", "behind", "x"), "wb") as f:
        f.write(b"z" * 300)
    rec = cli_json(gw, "usage", "reconcile", "default")
    assert rec["added"] >= 1
    assert used(gw, "vision")["used_bytes"] == 1800
    # The same from a parallel scan of the directory tree (projects = owned top-level directories).
    with open(os.path.join(gw.mount, "vision", "behind", "y"), "wb") as f:
        f.write(b"y" * 200)
    scan = cli_json(gw, "usage", "reconcile", "default", "--posix")
    assert scan["teams"]["vision"] == [2000, 4], scan
    assert used(gw, "vision")["used_bytes"] == 2000
    # A key issued to one job: its writes count for the job; an x-strata-job header still takes precedence.
    j = s3_for(gw, {"access_key": JOB_KEY, "secret_key": JOB_SECRET})
    j.put_object(Bucket="default", Key="vision/eval/out", Body=b"e" * 700)
    j.meta.events.register("before-sign.s3.PutObject", tag_job("job-43"))
    j.put_object(Bucket="default", Key="vision/eval/out2", Body=b"f" * 300)
    by_job = {l["group"]: l for l in cli_json(gw, "usage", "--by", "job")}
    assert by_job["nightly-eval"]["bytes"] == 700 and by_job["nightly-eval"]["team"] == "vision", by_job
    assert by_job["job-43"]["bytes"] == 300, by_job
    assert gw.canary_intact()


def test_cleanup_plan_run_restore_with_protections(tenancy):
    gw, keys, vision_admin = tenancy
    v = s3_for(gw, keys["vision"])
    for k in ("old1", "old2", "keep/pinned"):
        v.put_object(Bucket="default", Key=f"vision/tmp/{k}", Body=b"t" * 100)
    cli(gw, "protect", "pin", "--team", "vision", "--backend", "default", "vision/tmp/keep/", token=vision_admin)
    # Bad policies are refused with a clear error.
    for bad in (["--prefix", "*", "--age", "1"], ["--prefix", "", "--age", "1"], ["--prefix", "vision/tmp", "--age", "0"]):
        r = cli(gw, "policy", "add", "--team", "vision", "--backend", "default", "--kind", "ttl", *bad,
                token=vision_admin, check=False)
        assert r.returncode != 0 and "400" in r.stderr, r.stderr
    cli(gw, "policy", "add", "--team", "vision", "--backend", "default", "--kind", "ttl", "--prefix", "vision/tmp",
        "--age", "1", token=vision_admin)
    time.sleep(2.1)
    plan = cli_json(gw, "cleanup", "plan", "--team", "vision", token=vision_admin)
    keys_planned = sorted(i["key"] for i in plan["items"])
    assert keys_planned == ["vision/tmp/old1", "vision/tmp/old2"], keys_planned
    assert plan["protected"] == 1
    assert os.path.exists(os.path.join(gw.mount, "vision/tmp/old1")), "a plan deletes nothing"
    run = cli_json(gw, "cleanup", "run", plan["plan"]["id"], token=vision_admin)
    assert run["trashed"] == 2 and run["status"] == "done", run
    with pytest.raises(ClientError):
        v.head_object(Bucket="default", Key="vision/tmp/old1")
    assert v.get_object(Bucket="default", Key="vision/tmp/keep/pinned")["Body"].read() == b"t" * 100
    # The human table names the plan's items.
    show = cli(gw, "cleanup", "show", plan["plan"]["id"], token=vision_admin).stdout
    assert "vision/tmp/old1" in show and "trashed" in show
    restored = cli_json(gw, "cleanup", "restore", plan["plan"]["id"], token=vision_admin)
    assert restored["restored"] == 2
    assert v.get_object(Bucket="default", Key="vision/tmp/old2")["Body"].read() == b"t" * 100
    audit = cli_json(gw, "audit", "--team", "vision", "--limit", "200")
    actions = {a["action"] for a in audit}
    assert {"cleanup.plan", "cleanup.trash", "cleanup.run", "cleanup.restore", "pin.add", "policy.add"} <= actions
    # The API refuses requests without a token; health and the OpenAPI document are open.
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(gw.api + "/v1/teams")
    assert e.value.code == 401
    doc = json.load(urllib.request.urlopen(gw.api + "/openapi.json"))
    assert "/v1/cleanup/plans/{id}/run" in doc["paths"]
    assert json.load(api_get(gw.api + "/v1/whoami"))["is_admin"] is True
    # Forecast and scratch from the CLI.
    out = cli(gw, "forecast").stdout
    assert "KIND" in out
    # A volume's capacity is what df counts, used + available: blocks reserved for root are neither.
    volumes = [f for f in cli_json(gw, "forecast") if f["kind"] == "volume"]
    assert volumes, "no volume sampled"
    for f in volumes:
        st = os.statvfs(f["scope"])
        usable = (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
        assert abs(f["capacity"] - usable) <= usable // 100, (f, st)  # what was written since moves neither
    s = cli_json(gw, "scratch", "alloc", "--team", "vision", "--bytes", "1MiB", "--ttl", "1h", token=vision_admin)
    assert os.path.isdir(s["path"])
    cli(gw, "scratch", "free", s["id"], token=vision_admin)
    assert not os.path.exists(s["path"])


def test_checkpoint_saves_replicas_and_cache_pins_are_admitted_first(tenancy, tmp_path, monkeypatch):
    import numpy as np
    import strata

    gw, keys, _ = tenancy
    member = cli_json(gw, "token", "create", "--name", "trainer", "--team", "nlp")["token"]
    cli(gw, "quota", "set", "nlp", "--scope", "ckpt", "--hard-bytes", "3MiB")
    monkeypatch.setenv("STRATA_TOKEN", member)
    agent = gw.api.split("://", 1)[1]
    ck_dir = os.path.join(gw.mount, "nlp", "ck")   # where nlp's members may write: the agent takes saves over
    ck = strata.Checkpointer("run-q", ck_dir, agent=agent, team="nlp", keep_local=1,
                             rank=0, world_size=1)
    small = {"w": np.ones(MIB // 4, dtype=np.float32)}          # 1 MiB
    big = {"w": np.ones(3 * MIB // 4, dtype=np.float32)}        # 3 MiB: over the limit with the first
    assert ck.save(1, small).wait() == "done"
    q = used(gw, "nlp", "ckpt")
    assert MIB <= q["used_bytes"] < MIB + 4096, q
    h = ck.save(2, big)
    assert h.wait() == "failed"
    assert "quota" in str(h.error), h.error
    assert not glob.glob(os.path.join(ck_dir, "run-q", "step-*00002")), "nothing of a refused save is written"
    # Retention gives the bytes of deleted checkpoints back: usage stays at one checkpoint.
    assert ck.save(3, small).wait() == "done"
    assert ck.save(4, small).wait() == "done"
    q = used(gw, "nlp", "ckpt")
    assert MIB <= q["used_bytes"] < MIB + 4096, q
    assert q["reserved_bytes"] == 0
    assert ck.load_latest()[0] == 4

    # A replica pushed to an agent's peer API is admitted on the writer's `peer` scope before it is read.
    import urllib.error
    import urllib.request
    cli(gw, "quota", "set", "nlp", "--scope", "peer", "--hard-bytes", "1KiB")
    url = f"{gw.api}/v1/peer/ckpt/run-p/1/rank-00000.safetensors"
    req = urllib.request.Request(url, data=b"x" * 4096, method="PUT",
                                 headers={"Authorization": f"Bearer {member}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 429

    # Cache pins: the prefix's bytes are admitted on the team's `cache` scope, given back on unpin.
    n = s3_for(gw, keys["nlp"])
    for i in range(5):
        n.put_object(Bucket="default", Key=f"nlp/pinme/{i}", Body=b"p" * 2000)
    cli(gw, "quota", "set", "nlp", "--scope", "cache", "--hard-bytes", "5KiB")
    r = cli(gw, "cache", "pin", "default/nlp/pinme/", token=member, check=False)
    assert r.returncode != 0 and "quota exceeded" in r.stderr, r.stderr
    cli(gw, "quota", "set", "nlp", "--scope", "cache", "--hard-bytes", "1MiB")
    cli(gw, "cache", "pin", "default/nlp/pinme/", token=member)
    assert used(gw, "nlp", "cache")["used_bytes"] == 10_000
    cli(gw, "cache", "unpin", "default/nlp/pinme/", token=member)
    assert used(gw, "nlp", "cache")["used_bytes"] == 0


def chunked_put(gw, key, cred, data, declared, trailer=True):
    """A correctly signed aws-chunked PUT (unsigned chunks) whose x-amz-decoded-content-length is `declared`;
    without `trailer`, the checksum trailer its `x-amz-trailer` promises never comes."""
    import urllib.request
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    import base64
    import zlib

    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big"))
    body = b"%x\r\n" % len(data) + data + b"\r\n0\r\n"
    body += (b"x-amz-checksum-crc32:" + crc + b"\r\n\r\n") if trailer else b"\r\n"
    url = f"{gw.endpoint}/default/{key}"
    headers = {"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "content-encoding": "aws-chunked",
               "x-amz-trailer": "x-amz-checksum-crc32", "x-amz-decoded-content-length": str(declared),
               "content-length": str(len(body))}
    req = AWSRequest(method="PUT", url=url, data=body, headers=headers)
    SigV4Auth(Credentials(cred["access_key"], cred["secret_key"]), "s3", "us-east-1").add_auth(req)
    r = urllib.request.Request(url, data=body, method="PUT", headers=dict(req.headers.items()))
    try:
        with urllib.request.urlopen(r) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_an_aws_chunked_put_is_held_to_its_declared_length(tenancy):
    gw, keys, _ = tenancy
    cli(gw, "quota", "set", "vision", "--scope", "default", "--hard-bytes", "4MiB")
    s3 = s3_for(gw, keys["vision"])
    # The form itself is accepted when the declared length is the truth.
    status, body = chunked_put(gw, "vision/chunked/ok.bin", keys["vision"], b"x" * 1000, 1000)
    assert status == 200, body
    assert s3.get_object(Bucket="default", Key="vision/chunked/ok.bin")["Body"].read() == b"x" * 1000
    before = used(gw, "vision")
    # Declaring 1 byte to slip 8 MiB past a 4 MiB limit: refused, nothing stored, nothing charged.
    status, body = chunked_put(gw, "vision/chunked/big.bin", keys["vision"], os.urandom(8 * MIB), 1)
    assert status == 400 and b"IncompleteBody" in body, (status, body[:300])
    # Declaring more than is sent: refused the same way.
    status, body = chunked_put(gw, "vision/chunked/short.bin", keys["vision"], b"y" * 10, 5000)
    assert status == 400 and b"IncompleteBody" in body, (status, body[:300])
    for key in ("vision/chunked/big.bin", "vision/chunked/short.bin"):
        with pytest.raises(ClientError):
            s3.head_object(Bucket="default", Key=key)
    after = used(gw, "vision")
    assert (after["used_bytes"], after["reserved_bytes"]) == (before["used_bytes"], 0), (before, after)
    s3.delete_object(Bucket="default", Key="vision/chunked/ok.bin")
    cli(gw, "quota", "set", "vision", "--scope", "default")


def test_under_umask_000_everything_the_agent_writes_is_its_owners_alone(origin):
    gw = Gateway(origin, umask=0)
    try:
        s3 = gw.client()
        s3.put_object(Bucket="default", Key="vision/private.bin", Body=os.urandom(3 * MIB))
        assert len(s3.get_object(Bucket="default", Key="vision/private.bin")["Body"].read()) == 3 * MIB
        up = s3.create_multipart_upload(Bucket="default", Key="vision/parts.bin")["UploadId"]
        s3.upload_part(Bucket="default", Key="vision/parts.bin", UploadId=up, PartNumber=1, Body=b"p" * 1000)
        cli(gw, "team", "create", "vision")
        cli(gw, "token", "create", "--name", "someone", "--team", "vision", "--s3")
        assert os.stat(gw.data).st_mode & 0o777 == 0o700
        made_by_test = {gw.canary, gw.mount}
        seen = []
        for root, dirs, files in os.walk(gw.data):
            for name in dirs + files:
                path = os.path.join(root, name)
                if path in made_by_test:
                    continue
                mode = os.lstat(path).st_mode & 0o777
                seen.append(path)
                assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
        names = " ".join(seen)
        for want in ("catalog", "private.bin", "uploads", "cache"):
            assert want in names, (want, seen)
        s3.abort_multipart_upload(Bucket="default", Key="vision/parts.bin", UploadId=up)
    finally:
        gw.close()


def test_the_catalog_file_alone_yields_no_usable_secret(tenancy, tmp_path):
    """Another user with a copy of the catalog database (and its WAL) finds no S3 secret in it: secrets are
    sealed with the key beside it (catalog.key, 0600), and bearer tokens are stored as hashes."""
    gw, _, _ = tenancy
    made = cli_json(gw, "token", "create", "--name", "at-rest", "--team", "vision", "--s3")
    token = cli_json(gw, "token", "create", "--name", "at-rest-token", "--team", "vision")["token"]
    secret, access = made["secret_key"], made["access_key"]
    # The key works: the secret opens for SigV4 (through the gateway).
    s3_for(gw, made).list_objects_v2(Bucket="default", Prefix="vision/")
    dump = b"".join(open(os.path.join(gw.data, f), "rb").read() for f in os.listdir(gw.data)
                    if f.startswith("catalog.db"))
    assert access.encode() in dump, "the dump should hold the catalog's rows"
    assert secret.encode() not in dump, "an S3 secret key is in the catalog in clear"
    assert token.encode() not in dump, "a bearer token is in the catalog in clear"
    import sqlite3
    copy = tmp_path / "stolen.db"
    for suffix in ("", "-wal"):
        src = os.path.join(gw.data, "catalog.db" + suffix)
        if os.path.exists(src):
            with open(str(copy) + suffix, "wb") as f:
                f.write(open(src, "rb").read())
    db = sqlite3.connect(copy)
    for (stored,) in db.execute("SELECT secret_key FROM principals WHERE secret_key IS NOT NULL"):
        assert stored.startswith("enc1:") and secret not in stored, stored
    assert os.stat(os.path.join(gw.data, "catalog.key")).st_mode & 0o777 == 0o600


def test_write_headers_the_gateway_does_not_implement_are_refused_not_ignored(tenancy):
    gw, keys, _ = tenancy
    s3 = s3_for(gw, keys["vision"])
    key = "vision/headers/x.bin"
    asks = [dict(ServerSideEncryption="AES256"), dict(SSEKMSKeyId="k1", ServerSideEncryption="aws:kms"),
            dict(SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32), dict(Tagging="team=vision"),
            dict(StorageClass="GLACIER"), dict(ACL="public-read"), dict(WebsiteRedirectLocation="/elsewhere")]
    for extra in asks:
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket="default", Key=key, Body=b"secret", **extra)
        assert code_of(e.value) == ("NotImplemented", 501), (extra, e.value.response)
        with pytest.raises(ClientError):
            s3.head_object(Bucket="default", Key=key)
        with pytest.raises(ClientError) as e:
            s3.create_multipart_upload(Bucket="default", Key=key, **extra)
        assert code_of(e.value) == ("NotImplemented", 501), extra
    s3.put_object(Bucket="default", Key=key, Body=b"plain", ACL="private", StorageClass="STANDARD")
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="default", Key=key + ".copy", CopySource={"Bucket": "default", "Key": key},
                       ServerSideEncryption="AES256")
    assert code_of(e.value) == ("NotImplemented", 501)
    with pytest.raises(ClientError):
        s3.head_object(Bucket="default", Key=key + ".copy")
    s3.delete_object(Bucket="default", Key=key)


def test_presigned_urls_are_valid_for_at_most_seven_days(tenancy):
    import urllib.request

    gw, keys, _ = tenancy
    s3 = s3_for(gw, keys["vision"])
    s3.put_object(Bucket="default", Key="vision/presigned.bin", Body=b"shared")
    v4 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=keys["vision"]["access_key"],
                      aws_secret_access_key=keys["vision"]["secret_key"], region_name="us-east-1",
                      config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    cases = [(c, secs, want) for c in (s3, v4)  # boto3 presigns SigV2 by default
             for secs, want in ((7 * 86400 - 60, 200), (7 * 86400 + 3600, 400), (365 * 86400, 400))]
    # A negative expiry is an expired request, as S3 answers it (SigV4; SigV2's Expires is a date).
    cases += [(v4, -60, 403)]
    for client, secs, want in cases:
        url = client.generate_presigned_url("get_object", Params={"Bucket": "default", "Key": "vision/presigned.bin"},
                                        ExpiresIn=secs)
        try:
            with urllib.request.urlopen(url) as r:
                status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        assert status == want, (url, secs, status, body[:300])
        if want == 400:
            assert b"AuthorizationQueryParametersError" in body, body
        if want == 403:
            assert b"AccessDenied" in body and b"expired" in body, body
    s3.delete_object(Bucket="default", Key="vision/presigned.bin")


def test_headers_that_act_must_be_signed(tenancy):
    import urllib.request
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    gw, keys, _ = tenancy
    v = keys["vision"]
    s3 = s3_for(gw, v)
    s3.put_object(Bucket="default", Key="vision/source.bin", Body=b"source bytes")

    def send(url, headers, body=b"payload"):
        r = urllib.request.Request(url, data=body, method="PUT", headers=headers)
        try:
            with urllib.request.urlopen(r) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    # A signed PUT with headers added after signing.
    for extra in ({"x-amz-copy-source": "default/vision/source.bin"}, {"x-amz-meta-owner": "mallory"},
                  {"x-amz-acl": "private"}):
        url = f"{gw.endpoint}/default/vision/target.bin"
        req = AWSRequest(method="PUT", url=url, data=b"payload", headers={"content-length": "7"})
        S3SigV4Auth(Credentials(v["access_key"], v["secret_key"]), "s3", "us-east-1").add_auth(req)
        assert send(url, dict(req.headers.items()))[0] == 200, "the signed request as signed is good"
        status, body = send(url, {**dict(req.headers.items()), **extra})
        assert status == 403 and b"must be signed" in body, (extra, status, body[:300])
    # A presigned PUT URL with a copy source added by whoever holds the URL.
    v4 = boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=v["access_key"],
                      aws_secret_access_key=v["secret_key"], region_name="us-east-1",
                      config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    url = v4.generate_presigned_url("put_object", Params={"Bucket": "default", "Key": "vision/target.bin"},
                                    ExpiresIn=600)
    status, body = send(url, {"x-amz-copy-source": "default/vision/source.bin"}, body=b"")
    assert status == 403, (status, body[:300])
    got = s3.get_object(Bucket="default", Key="vision/target.bin")
    assert got["Body"].read() == b"payload" and not got["Metadata"], "nothing was copied or stored"
    # The URL itself works as issued, and signed metadata is stored.
    assert send(url, {})[0] == 200
    s3.put_object(Bucket="default", Key="vision/meta.bin", Body=b"m", Metadata={"owner": "vision"})
    assert s3.head_object(Bucket="default", Key="vision/meta.bin")["Metadata"] == {"owner": "vision"}
    for k in ("vision/source.bin", "vision/target.bin", "vision/meta.bin"):
        s3.delete_object(Bucket="default", Key=k)


def test_a_reader_key_writes_nowhere(tenancy):
    gw, keys, _ = tenancy
    reader = cli_json(gw, "token", "create", "--name", "vision-reader-key", "--team", "vision", "--s3",
                      "--role", "reader")
    member = s3_for(gw, keys["vision"])
    r = s3_for(gw, reader)
    member.put_object(Bucket="default", Key="shared-space/theirs.bin", Body=b"a member's object")
    for key in ("shared-space/mine.bin", "shared-space/theirs.bin", "vision/mine.bin"):
        with pytest.raises(ClientError) as e:
            r.put_object(Bucket="default", Key=key, Body=b"reader bytes")
        assert code_of(e.value) == ("AccessDenied", 403), key
    with pytest.raises(ClientError) as e:
        r.delete_object(Bucket="default", Key="shared-space/theirs.bin")
    assert code_of(e.value) == ("AccessDenied", 403)
    # A write refused before its body is read closes the connection after the answer: the client's next
    # request is never parsed from the rest of the refused body (seen as a bare 400 on the next request).
    import urllib.request
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"{gw.endpoint}/default/shared-space/raw.bin"
    req = AWSRequest(method="PUT", url=url, data=b"reader bytes", headers={"content-length": "12"})
    S3SigV4Auth(Credentials(reader["access_key"], reader["secret_key"]), "s3", "us-east-1").add_auth(req)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, data=b"reader bytes", method="PUT",
                                                      headers=dict(req.headers.items())))
    assert e.value.code == 403 and e.value.headers.get("connection", "").lower() == "close", e.value.headers
    # Reading is what a reader does.
    assert r.get_object(Bucket="default", Key="shared-space/theirs.bin")["Body"].read() == b"a member's object"
    member.delete_object(Bucket="default", Key="shared-space/theirs.bin")


def test_listings_show_and_count_only_what_the_caller_may_read(tenancy):
    """Another team's keys never surface in a listing: not as entries, not in a continuation token (sealed),
    not as V1's NextMarker, not through IsTruncated or KeyCount."""
    gw, keys, _ = tenancy
    cli(gw, "prefix", "own", "default", "lst/v", "vision")
    vision, nlp = s3_for(gw, keys["vision"]), s3_for(gw, keys["nlp"])
    for i in range(5):
        vision.put_object(Bucket="default", Key=f"lst/v/secret-{i}", Body=b"v")
    nlp.put_object(Bucket="default", Key="lst/a", Body=b"a")
    # Only hidden keys follow lst/a: the listing is complete, not truncated.
    r = nlp.list_objects_v2(Bucket="default", Prefix="lst/", MaxKeys=1)
    assert [o["Key"] for o in r["Contents"]] == ["lst/a"] and r["KeyCount"] == 1
    assert r["IsTruncated"] is False, r
    r = nlp.list_objects(Bucket="default", Prefix="lst/", MaxKeys=1)
    assert [o["Key"] for o in r["Contents"]] == ["lst/a"] and r["IsTruncated"] is False, r
    # A visible key after the hidden ones: pages of one, each full, the token telling nothing.
    nlp.put_object(Bucket="default", Key="lst/z", Body=b"z")
    r = nlp.list_objects_v2(Bucket="default", Prefix="lst/", MaxKeys=1)
    assert [o["Key"] for o in r["Contents"]] == ["lst/a"] and r["IsTruncated"] is True
    token = r["NextContinuationToken"]
    for hidden in ("lst/a", "lst/v/secret-0", "lst/z"):
        assert hidden.encode().hex() not in token
    r2 = nlp.list_objects_v2(Bucket="default", Prefix="lst/", MaxKeys=1, ContinuationToken=token)
    assert [o["Key"] for o in r2["Contents"]] == ["lst/z"] and r2["IsTruncated"] is False and r2["KeyCount"] == 1
    r = nlp.list_objects(Bucket="default", Prefix="lst/", MaxKeys=1, Delimiter="/")
    assert r["IsTruncated"] is True and r.get("NextMarker") == "lst/a", r
    r = nlp.list_objects(Bucket="default", Prefix="lst/", MaxKeys=5, Marker="lst/a")
    assert [o["Key"] for o in r["Contents"]] == ["lst/z"], r
    # Delimited: the hidden common prefix is not shown either.
    r = nlp.list_objects_v2(Bucket="default", Prefix="lst/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["lst/a", "lst/z"] and "CommonPrefixes" not in r, r
    # The owner sees its keys; a forged or re-aimed token is refused.
    r = vision.list_objects_v2(Bucket="default", Prefix="lst/", MaxKeys=10)
    assert r["KeyCount"] == 7, r
    for bad in ("lst/v/secret-3".encode().hex(), token[:-2] + ("00" if token[-2:] != "00" else "11")):
        with pytest.raises(ClientError) as e:
            nlp.list_objects_v2(Bucket="default", Prefix="lst/", ContinuationToken=bad)
        assert code_of(e.value) == ("InvalidArgument", 400), e.value.response
    with pytest.raises(ClientError) as e:
        nlp.list_objects_v2(Bucket="default", Prefix="other/", ContinuationToken=token)
    assert code_of(e.value) == ("InvalidArgument", 400)


def _s3(gw, access, secret):
    return boto3.client("s3", endpoint_url=gw.endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                        region_name="us-east-1",
                        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}))


def test_gateway_matrix_every_operation_and_every_caller_on_another_teams_prefix(tenancy):
    """Every S3 operation x every kind of caller, aimed at team vision's prefix: what each role may do there
    works, everything else is refused (403) and changes nothing; listings show the prefix only to readers."""
    gw, keys, _ = tenancy
    made = {}
    for team in ("vision", "nlp"):
        for role in ("reader", "member", "team_admin"):
            made[(team, role)] = cli_json(gw, "token", "create", "--name", f"mx-{team}-{role}", "--team", team,
                                          "--role", role, "--s3")
    made[("admin", "")] = cli_json(gw, "token", "create", "--name", "mx-admin", "--admin", "--s3")
    callers = {f"{t}-{r}" if r else t: _s3(gw, k["access_key"], k["secret_key"]) for (t, r), k in made.items()}
    anon = boto3.client("s3", endpoint_url=gw.endpoint, region_name="us-east-1",
                        config=Config(signature_version=botocore.UNSIGNED, retries={"max_attempts": 1},
                                      s3={"addressing_style": "path"}))
    callers["anonymous"] = anon
    callers["forged-key"] = _s3(gw, "SKNOSUCHKEY00000000", "x" * 40)
    callers["forged-secret"] = _s3(gw, made[("vision", "member")]["access_key"], "y" * 40)
    owner = callers["vision-member"]
    B = "default"
    owner.put_object(Bucket=B, Key="vision/mx/secret.bin", Body=b"vision's secret")
    owner.put_object(Bucket=B, Key="vision/mx/victim.bin", Body=b"vision's victim")
    open_src = "open-mx/src.bin"
    callers["nlp-member"].put_object(Bucket=B, Key=open_src, Body=b"open bytes")
    upload = owner.create_multipart_upload(Bucket=B, Key="vision/mx/mp.bin")["UploadId"]
    need = {  # the role each operation needs in the team owning vision/
        "get": "reader", "head": "reader", "presigned_get": "reader", "list_v2": "reader", "list_v1": "reader",
        "copy_out": "member",  # reads vision's object, and writes outside owned prefixes: a member's act
        "put": "member", "copy_in": "member", "delete": "member",
        "delete_objects": "member", "create_multipart": "member", "upload_part": "member",
        "complete_multipart": "member", "abort_multipart": "member",
    }

    def op(name, c):
        if name == "get":
            return c.get_object(Bucket=B, Key="vision/mx/secret.bin")["Body"].read()
        if name == "head":
            return c.head_object(Bucket=B, Key="vision/mx/secret.bin")["ContentLength"]
        if name == "presigned_get":
            url = c.generate_presigned_url("get_object", Params={"Bucket": B, "Key": "vision/mx/secret.bin"},
                                           ExpiresIn=60)
            try:
                return urllib.request.urlopen(url).read()
            except urllib.error.HTTPError as e:
                raise ClientError({"Error": {"Code": "AccessDenied"},
                                   "ResponseMetadata": {"HTTPStatusCode": e.code}}, "GetObject") from e
        if name == "list_v2":
            r = c.list_objects_v2(Bucket=B, Prefix="vision/mx/")
            return [o["Key"] for o in r.get("Contents", [])]
        if name == "list_v1":
            r = c.list_objects(Bucket=B, Prefix="vision/mx/", MaxKeys=1)
            return [o["Key"] for o in r.get("Contents", [])] + [r.get("NextMarker", "")]
        if name == "copy_out":
            return c.copy_object(Bucket=B, Key="open-mx/stolen.bin",
                                 CopySource={"Bucket": B, "Key": "vision/mx/secret.bin"})
        if name == "put":
            return c.put_object(Bucket=B, Key="vision/mx/victim.bin", Body=b"overwritten")
        if name == "copy_in":
            return c.copy_object(Bucket=B, Key="vision/mx/victim.bin", CopySource={"Bucket": B, "Key": open_src})
        if name == "delete":
            return c.delete_object(Bucket=B, Key="vision/mx/victim.bin")
        if name == "delete_objects":
            r = c.delete_objects(Bucket=B, Delete={"Objects": [{"Key": "vision/mx/victim.bin"}]})
            if r.get("Errors"):
                raise ClientError({"Error": {"Code": r["Errors"][0]["Code"]},
                                   "ResponseMetadata": {"HTTPStatusCode": 403}}, "DeleteObjects")
            return r
        if name == "create_multipart":
            return c.create_multipart_upload(Bucket=B, Key="vision/mx/new.bin")
        if name == "upload_part":
            return c.upload_part(Bucket=B, Key="vision/mx/mp.bin", UploadId=upload, PartNumber=1, Body=b"p")
        if name == "complete_multipart":
            return c.complete_multipart_upload(Bucket=B, Key="vision/mx/mp.bin", UploadId=upload,
                                               MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]})
        if name == "abort_multipart":
            return c.abort_multipart_upload(Bucket=B, Key="vision/mx/mp.bin", UploadId=upload)
        raise AssertionError(name)

    rank = {"reader": 1, "member": 2, "team_admin": 3}

    def allowed(who, name):
        if name in ("upload_part", "complete_multipart", "abort_multipart"):
            return who == "vision-member"  # an upload's steps belong to the key that started it
        if who == "admin":
            return True
        team, _, role = who.partition("-")
        return team == "vision" and role in rank and rank[role] >= rank[need[name]]

    def state():
        got = {}
        for k in ("vision/mx/secret.bin", "vision/mx/victim.bin"):
            o = owner.get_object(Bucket=B, Key=k)
            got[k] = (o["Body"].read(), o["ETag"])
        got["parts"] = owner.list_parts(Bucket=B, Key="vision/mx/mp.bin", UploadId=upload).get("Parts", [])
        got["usage"] = used(gw, "vision")["used_bytes"]
        return got

    before = state()
    refused = 0
    for name in need:
        for who, c in callers.items():
            if allowed(who, name):
                continue
            if name in ("list_v2", "list_v1") and who not in ("anonymous", "forged-key", "forged-secret"):
                # A listing is answered, with nothing of the prefix in it (keys, markers, counts).
                assert op(name, c) in ([], [""]), (who, name)
                refused += 1
                continue
            with pytest.raises(ClientError) as e:
                op(name, c)
            status = e.value.response["ResponseMetadata"]["HTTPStatusCode"]
            assert status == 403, (who, name, e.value.response)
            refused += 1
    assert refused >= 90, refused
    assert state() == before, "a refused operation changed team vision's data"
    with pytest.raises(ClientError):
        owner.head_object(Bucket=B, Key="open-mx/stolen.bin")
    # What each role may do works (the changing ones last, in an order that keeps their targets there).
    for name in need:
        for who, c in callers.items():
            if not allowed(who, name) or name in ("delete", "delete_objects", "complete_multipart",
                                                  "abort_multipart"):
                continue
            op(name, c)
    callers["vision-member"].abort_multipart_upload(Bucket=B, Key="vision/mx/mp.bin", UploadId=upload)
    for who in ("vision-member", "vision-team_admin", "admin"):
        callers["vision-member"].put_object(Bucket=B, Key="vision/mx/victim.bin", Body=b"again")
        op("delete", callers[who])


def test_another_teams_object_in_unowned_space_stays_its_own(tenancy):
    """Outside owned prefixes anyone reads, but an object written there by one team is overwritten or deleted
    only by that team (which would otherwise hand that team's usage back)."""
    gw, keys, _ = tenancy
    vision, nlp = s3_for(gw, keys["vision"]), s3_for(gw, keys["nlp"])
    key = "shared-space/vision-wrote-this.bin"
    vision.put_object(Bucket="default", Key=key, Body=b"v" * 1000)
    usage = used(gw, "vision")["used_bytes"]
    assert nlp.get_object(Bucket="default", Key=key)["Body"].read() == b"v" * 1000
    for attempt in (lambda: nlp.put_object(Bucket="default", Key=key, Body=b"n"),
                    lambda: nlp.delete_object(Bucket="default", Key=key),
                    lambda: nlp.copy_object(Bucket="default", Key=key,
                                            CopySource={"Bucket": "default", "Key": key})):
        with pytest.raises(ClientError) as e:
            attempt()
        assert code_of(e.value) == ("AccessDenied", 403), e.value.response
    r = nlp.delete_objects(Bucket="default", Delete={"Objects": [{"Key": key}]})
    assert r.get("Errors") and r["Errors"][0]["Code"] == "AccessDenied", r
    assert vision.get_object(Bucket="default", Key=key)["Body"].read() == b"v" * 1000
    assert used(gw, "vision")["used_bytes"] == usage
    vision.delete_object(Bucket="default", Key=key)


def test_an_xml_body_over_the_limit_is_a_clear_400(tenancy):
    gw, keys, _ = tenancy
    s3 = s3_for(gw, keys["vision"])
    objects = [{"Key": "vision/" + "k" * 1000 + f"/{i}"} for i in range(21_000)]   # about 21 MiB of XML
    with pytest.raises(ClientError) as e:
        s3.delete_objects(Bucket="default", Delete={"Objects": objects})
    assert code_of(e.value) == ("MaxMessageLengthExceeded", 400), e.value.response
    s3.list_objects_v2(Bucket="default", Prefix="vision/")   # the gateway is fine


def test_local_directory_keys_never_alias_and_every_key_is_stored(tenancy):
    """On a local-directory backend `P` and `P/` are two objects, never one; an object can also be a prefix
    (`P` and `P/x`), whichever comes first, by PUT, copy or multipart upload; no team can block another's
    owned prefix by creating the object in its way."""
    gw, keys, _ = tenancy
    cli(gw, "prefix", "own", "default", "va-empty", "vision")
    vision, nlp = s3_for(gw, keys["vision"]), s3_for(gw, keys["nlp"])
    vision.put_object(Bucket="default", Key="va-empty/", Body=b"folder marker")
    # Another team cannot put an object where vision's prefix is.
    with pytest.raises(ClientError) as e:
        nlp.put_object(Bucket="default", Key="va-empty", Body=b"in the way")
    assert code_of(e.value) == ("AccessDenied", 403), e.value.response
    vision.put_object(Bucket="default", Key="va-empty/x", Body=b"x")
    vision.put_object(Bucket="default", Key="va-empty", Body=b"the object P")
    # `P` is never read, overwritten or deleted through `P/`, nor the other way round.
    nlp.put_object(Bucket="default", Key="open-p", Body=b"the file P")
    with pytest.raises(ClientError) as e:
        nlp.get_object(Bucket="default", Key="open-p/")
    assert code_of(e.value)[1] == 404, e.value.response
    nlp.delete_object(Bucket="default", Key="open-p/")
    assert nlp.get_object(Bucket="default", Key="open-p")["Body"].read() == b"the file P"
    nlp.put_object(Bucket="default", Key="open-p/", Body=b"P/")
    nlp.put_object(Bucket="default", Key="open-p/below", Body=b"b")
    # An object that is also a prefix, made the other way round, by each kind of write.
    nlp.put_object(Bucket="default", Key="open-d/below", Body=b"b")
    nlp.put_object(Bucket="default", Key="open-d", Body=b"d")
    nlp.copy_object(Bucket="default", Key="open-c", CopySource={"Bucket": "default", "Key": "open-p"})
    nlp.put_object(Bucket="default", Key="open-c/x", Body=b"cx")
    nlp.put_object(Bucket="default", Key="open-m/x", Body=b"mx")
    up = nlp.create_multipart_upload(Bucket="default", Key="open-m")["UploadId"]
    part = nlp.upload_part(Bucket="default", Key="open-m", UploadId=up, PartNumber=1, Body=b"m")
    nlp.complete_multipart_upload(Bucket="default", Key="open-m", UploadId=up,
                                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    want = {"va-empty/": b"folder marker", "va-empty/x": b"x", "va-empty": b"the object P",
            "open-p": b"the file P", "open-p/": b"P/", "open-p/below": b"b", "open-d/below": b"b",
            "open-d": b"d", "open-c": b"the file P", "open-c/x": b"cx", "open-m/x": b"mx", "open-m": b"m"}
    for k, v in want.items():
        assert vision.get_object(Bucket="default", Key=k)["Body"].read() == v, k
    listed = {x["Key"] for p in ("va-empty", "open-") for x in
              vision.list_objects_v2(Bucket="default", Prefix=p).get("Contents", [])}
    assert set(want) <= listed and not {k for k in listed - set(want) if k.split("/")[0] in
                                        {"va-empty", "open-p", "open-d", "open-c", "open-m"}}, listed
    r = vision.list_objects_v2(Bucket="default", Prefix="open-p", Delimiter="/")
    assert [x["Key"] for x in r["Contents"]] == ["open-p"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["open-p/"]
    nlp.delete_object(Bucket="default", Key="open-p")
    assert nlp.get_object(Bucket="default", Key="open-p/")["Body"].read() == b"P/"
    assert nlp.get_object(Bucket="default", Key="open-p/below")["Body"].read() == b"b"


def _api(gw, method, path, token, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(gw.api + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_replicas_are_the_writing_teams(tenancy):
    """Peer replicas are the writing team's: another team names its own store with the same run."""
    gw, _, _ = tenancy
    v_member = cli_json(gw, "token", "create", "--name", "rep-v", "--team", "vision")["token"]
    n_member = cli_json(gw, "token", "create", "--name", "rep-n", "--team", "nlp")["token"]
    shard = "/v1/peer/ckpt/run-rep/1/rank-00000.safetensors"
    assert _api(gw, "PUT", shard, v_member, raw=b"vision's replica")[0] == 204
    status, body = _api(gw, "GET", shard, n_member)
    assert status == 404 and b"vision's replica" not in body, (status, body)
    assert _api(gw, "PUT", shard, n_member, raw=b"nlp's")[0] == 204
    assert _api(gw, "DELETE", "/v1/peer/ckpt/run-rep/1", n_member)[0] == 204
    assert _api(gw, "GET", shard, v_member) == (200, b"vision's replica")


def test_a_handoff_goes_only_where_its_caller_may_write(tenancy):
    """A handoff goes only where its caller may write, and never carries the agent's credential to a URL the
    caller chose (a listener on loopback gets no connection)."""
    import socket
    import numpy as np
    import strata

    gw, _, _ = tenancy
    n_member = cli_json(gw, "token", "create", "--name", "hand-n", "--team", "nlp")["token"]
    n_reader = cli_json(gw, "token", "create", "--name", "hand-nr", "--team", "nlp", "--role", "reader")["token"]
    # Vision's checkpoint on the agent's local backend; nlp tries to have it copied out, or pushed to its URL.
    v_dir = os.path.join(gw.mount, "vision", "ckpt-rep")
    ck = strata.Checkpointer("run-v", v_dir, rank=0, world_size=1, agent="")
    assert ck.save(1, {"w": np.ones(1000, dtype=np.float32)}).wait() == "done"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(1.0)
    chosen = f"127.0.0.1:{listener.getsockname()[1]}"
    hand = {"run_id": "run-v", "step": 1, "rank": 0, "world_size": 1, "upload": False, "local_dir": v_dir,
            "remote_url": None, "peers": [], "self_peer": None, "replicas": 0, "keep_local": 0,
            "keep_remote": 0, "keep_every": None, "commit_timeout_ms": 2000}
    status, body = _api(gw, "POST", "/v1/ckpt/handoff", n_member,
                        dict(hand, remote_url=f"file://{gw.mount}/nlp/stolen"))
    assert status == 403, (status, body)
    status, body = _api(gw, "POST", "/v1/ckpt/handoff", n_reader, dict(hand, local_dir=os.path.join(
        gw.mount, "nlp"), peers=[chosen], replicas=1, upload=False))
    assert status == 403, (status, body)
    with pytest.raises(socket.timeout):
        conn, _ = listener.accept()
        conn.settimeout(2)
        raise AssertionError(f"the agent called the caller's URL: {conn.recv(4096)!r}")
    listener.close()
    assert not os.path.exists(os.path.join(gw.mount, "nlp", "stolen"))


def test_a_promised_checksum_trailer_that_never_comes_stores_nothing(tenancy):
    """Issue 44, finding 5: an upload whose `x-amz-trailer` promises a checksum and whose body ends without it
    is unchecked: refused, nothing stored."""
    gw, keys, _ = tenancy
    s3 = s3_for(gw, keys["vision"])
    status, body = chunked_put(gw, "vision/chunked/no-trailer.bin", keys["vision"], b"z" * 1000, 1000,
                               trailer=False)
    assert status == 400 and b"trailer" in body, (status, body[:300])
    with pytest.raises(ClientError):
        s3.head_object(Bucket="default", Key="vision/chunked/no-trailer.bin")


def test_backends_show_where_they_are_to_administrators_only(tenancy):
    """Issue 44, finding 5: `GET /v1/backends` names the backends to every principal, but their URLs and ids
    (the agent host's absolute paths, endpoints) only to administrators."""
    gw, _, _ = tenancy
    member = cli_json(gw, "token", "create", "--name", "backends-member", "--team", "nlp")["token"]
    status, body = _api(gw, "GET", "/v1/backends", member)
    assert status == 200, body
    seen = json.loads(body)
    assert {b["name"] for b in seen} >= {"default", "origin"}
    assert all(set(b) == {"name", "scheme"} for b in seen), seen
    assert gw.mount.encode() not in body and b"127.0.0.1" not in body, body
    status, body = _api(gw, "GET", "/v1/backends", ADMIN_TOKEN)
    assert status == 200 and gw.mount.encode() in body, body


def test_the_operators_metrics_listen_on_loopback_unless_told():
    """Issue 44, finding 5: `strata operator run` serves /metrics on loopback by default (the manifests name
    0.0.0.0 for the pod)."""
    r = subprocess.run([STRATA, "operator", "run", "--help"], capture_output=True, text=True, check=True)
    assert "[default: 127.0.0.1:9464]" in " ".join(r.stdout.split()), r.stdout
