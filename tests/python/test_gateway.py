"""The S3 gateway against real S3 clients: boto3, the aws cli and s5cmd. Every transfer is checked byte-exact,
cold and from the cache; the origin is a real S3 server (moto)."""
import hashlib
import io
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from conftest import ACCESS_KEY, ORIGIN_KEY, ORIGIN_SECRET, SECRET_KEY, VENV_BIN, Gateway, api_get, client

BUCKETS = ["default", "origin"]


def sha(b):
    return hashlib.sha256(b).hexdigest()


def code_of(e):
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


def cache_stats(gw):
    return json.load(api_get(gw.api + "/v1/cache"))


@pytest.mark.parametrize("bucket", BUCKETS)
def test_put_get_range_cold_and_hot(gateway, bucket):
    s3 = gateway.client()
    data = os.urandom(5 * 1024 * 1024 + 12345)
    s3.put_object(Bucket=bucket, Key="rw/obj.bin", Body=data)
    fills_before = cache_stats(gateway)["fills"]
    cold = s3.get_object(Bucket=bucket, Key="rw/obj.bin")["Body"].read()
    mid = cache_stats(gateway)["fills"]
    hot = s3.get_object(Bucket=bucket, Key="rw/obj.bin")["Body"].read()
    assert sha(cold) == sha(data) and sha(hot) == sha(data)
    assert mid > fills_before, "the cold read filled the cache"
    assert cache_stats(gateway)["fills"] == mid, "the hot read was served from the cache"
    r = s3.get_object(Bucket=bucket, Key="rw/obj.bin", Range="bytes=1048570-2097160")
    assert r["Body"].read() == data[1048570:2097161]
    assert r["ContentRange"] == f"bytes 1048570-2097160/{len(data)}"
    assert s3.get_object(Bucket=bucket, Key="rw/obj.bin", Range="bytes=-10")["Body"].read() == data[-10:]
    head = s3.head_object(Bucket=bucket, Key="rw/obj.bin")
    assert head["ContentLength"] == len(data)
    # read-after-write: an overwrite is visible at once, never the cached old bytes
    data2 = os.urandom(1024 * 1024 + 7)
    s3.put_object(Bucket=bucket, Key="rw/obj.bin", Body=data2)
    assert sha(s3.get_object(Bucket=bucket, Key="rw/obj.bin")["Body"].read()) == sha(data2)
    # conditional reads
    etag = s3.head_object(Bucket=bucket, Key="rw/obj.bin")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="rw/obj.bin", IfNoneMatch=etag)
    assert code_of(e.value)[1] == 304
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="rw/obj.bin", IfMatch='"nope"')
    assert code_of(e.value)[1] == 412
    assert s3.get_object(Bucket=bucket, Key="rw/obj.bin", IfMatch=etag)["Body"].read() == data2
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key="rw/missing")
    assert code_of(e.value) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="no-such-bucket", Key="x")
    assert code_of(e.value)[0] == "NoSuchBucket"


@pytest.mark.parametrize("bucket", BUCKETS)
def test_listing_1000_plus_keys_with_pagination_and_delimiters(gateway, bucket):
    s3 = gateway.client()
    keys = [f"many/d{i % 4}/k{i:05}" for i in range(1100)] + ["many/top.txt"]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=k.encode()), keys))
    seen, pages = [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="many/",
                                                            PaginationConfig={"PageSize": 300}):
        pages += 1
        seen += [o["Key"] for o in page.get("Contents", [])]
    assert seen == sorted(keys) and pages == 4
    r = s3.list_objects_v2(Bucket=bucket, Prefix="many/", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == [f"many/d{i}/" for i in range(4)]
    assert [o["Key"] for o in r["Contents"]] == ["many/top.txt"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="many/", Delimiter="/", MaxKeys=2)
    assert r["IsTruncated"] and len(r.get("CommonPrefixes", [])) + len(r.get("Contents", [])) == 2
    r2 = s3.list_objects_v2(Bucket=bucket, Prefix="many/", Delimiter="/", ContinuationToken=r["NextContinuationToken"])
    assert [p["Prefix"] for p in r2["CommonPrefixes"]] == ["many/d2/", "many/d3/"]
    assert s3.list_objects_v2(Bucket=bucket, Prefix="many/d1/")["KeyCount"] == 275
    # delete many
    for chunk in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[chunk:chunk + 1000]]})
    assert s3.list_objects_v2(Bucket=bucket, Prefix="many/")["KeyCount"] == 0


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart_copy_delete_presigned(gateway, bucket):
    s3 = gateway.client()
    big = os.urandom(105 * 1024 * 1024)
    cfg = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=8 * 1024 * 1024, max_concurrency=4)
    s3.upload_fileobj(io.BytesIO(big), bucket, "mp/big.bin", Config=cfg)
    out = io.BytesIO()
    s3.download_fileobj(bucket, "mp/big.bin", out, Config=cfg)
    assert sha(out.getvalue()) == sha(big)
    hot = s3.get_object(Bucket=bucket, Key="mp/big.bin")["Body"].read()
    assert sha(hot) == sha(big)
    # no staged parts are left once the upload completed (only the record a repeated complete answers from)
    assert [d for d in os.listdir(os.path.join(gateway.data, "uploads")) if d != "completed"] == []
    # list parts and abort
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/aborted.bin")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="mp/aborted.bin", UploadId=up, PartNumber=1, Body=b"x" * (5 * 1024 * 1024))
    s3.upload_part(Bucket=bucket, Key="mp/aborted.bin", UploadId=up, PartNumber=2, Body=b"tail")
    parts = s3.list_parts(Bucket=bucket, Key="mp/aborted.bin", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 5 * 1024 * 1024), (2, 4)]
    s3.abort_multipart_upload(Bucket=bucket, Key="mp/aborted.bin", UploadId=up)
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="mp/aborted.bin")
    assert code_of(e.value)[1] == 404
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=bucket, Key="mp/aborted.bin", UploadId=up)
    assert code_of(e.value)[0] == "NoSuchUpload"
    # a part below 5 MiB that is not the last is refused
    up = s3.create_multipart_upload(Bucket=bucket, Key="mp/small.bin")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="mp/small.bin", UploadId=up, PartNumber=1, Body=b"a")["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="mp/small.bin", UploadId=up, PartNumber=2, Body=b"b")["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="mp/small.bin", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert code_of(e.value)[0] == "EntityTooSmall"
    s3.abort_multipart_upload(Bucket=bucket, Key="mp/small.bin", UploadId=up)
    assert [d for d in os.listdir(os.path.join(gateway.data, "uploads")) if d != "completed"] == []
    # copy, within and across buckets
    s3.copy_object(Bucket=bucket, Key="mp/copy.bin", CopySource={"Bucket": bucket, "Key": "mp/big.bin"})
    assert sha(s3.get_object(Bucket=bucket, Key="mp/copy.bin")["Body"].read()) == sha(big)
    other = [b for b in BUCKETS if b != bucket][0]
    s3.put_object(Bucket=bucket, Key="cp/small", Body=b"hello")
    s3.copy_object(Bucket=other, Key="cp/from-" + bucket, CopySource={"Bucket": bucket, "Key": "cp/small"})
    assert s3.get_object(Bucket=other, Key="cp/from-" + bucket)["Body"].read() == b"hello"
    # presigned GET, and an expired one
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "cp/small"}, ExpiresIn=300)
    assert urllib.request.urlopen(url).read() == b"hello"
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "cp/small"}, ExpiresIn=1)
    time.sleep(2.2)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    assert e.value.code == 403 and b"AccessDenied" in e.value.read()
    # delete
    for k in ("mp/big.bin", "mp/copy.bin", "cp/small"):
        s3.delete_object(Bucket=bucket, Key=k)
    s3.delete_object(Bucket=bucket, Key="cp/small")  # deleting twice is fine
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="mp/big.bin")


def env_for(gw):
    return dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")


def tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = sha(open(p, "rb").read())
    return out


def test_object_attributes_are_kept_cold_hot_multipart_and_copied(gateway, origin, tmp_path):
    """Content-Type, the other stored headers and user metadata (x-amz-meta-*) round-trip through the gateway
    on an object-store mount: single PUT and multipart, cold and from the cache, kept by a copy, replaced by a
    copy with REPLACE, overridden per request by a presigned GET; too much metadata is refused."""
    s3 = gateway.client()
    data = os.urandom(3 * 1024 * 1024 + 17)
    s3.put_object(Bucket="origin", Key="attrs/shard-000.tar", Body=data, ContentType="application/x-tar",
                  CacheControl="max-age=60", ContentDisposition='attachment; filename="shard.tar"',
                  ContentLanguage="en", Metadata={"Shard-Index": "7", "source": "laion"})
    want = {"ContentType": "application/x-tar", "CacheControl": "max-age=60",
            "ContentDisposition": 'attachment; filename="shard.tar"', "ContentLanguage": "en"}
    meta = {"shard-index": "7", "source": "laion"}
    # what the origin itself stored: the attributes as they were given, and what S3 keeps beyond them (here the
    # CRC32 boto3 sends) in Strata's one reserved entry
    o = client(origin, ORIGIN_KEY, ORIGIN_SECRET).head_object(Bucket="gw-origin", Key="attrs/shard-000.tar")
    assert o["ContentType"] == "application/x-tar"
    assert {k: v for k, v in o["Metadata"].items() if k != "strataobject"} == meta
    assert o["Metadata"]["strataobject"].startswith("c=CRC32:")
    for _ in range(2):  # cold, then from the cache
        r = s3.get_object(Bucket="origin", Key="attrs/shard-000.tar")
        assert sha(r["Body"].read()) == sha(data)
        assert {k: r[k] for k in want} == want and r["Metadata"] == meta
        h = s3.head_object(Bucket="origin", Key="attrs/shard-000.tar")
        assert {k: h[k] for k in want} == want and h["Metadata"] == meta
    url = s3.generate_presigned_url("get_object", Params={
        "Bucket": "origin", "Key": "attrs/shard-000.tar", "ResponseContentType": "application/octet-stream"})
    with urllib.request.urlopen(url) as resp:
        assert resp.headers["Content-Type"] == "application/octet-stream"
        assert resp.headers["x-amz-meta-source"] == "laion"
        assert sha(resp.read()) == sha(data)
    # multipart (boto3's upload_fileobj above 5 MiB)
    big = os.urandom(12 * 1024 * 1024 + 5)
    s3.upload_fileobj(io.BytesIO(big), "origin", "attrs/big.bin",
                      ExtraArgs={"ContentType": "application/x-npy", "Metadata": {"rows": "1024"}},
                      Config=TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024))
    h = s3.head_object(Bucket="origin", Key="attrs/big.bin")
    assert h["ContentType"] == "application/x-npy" and h["Metadata"] == {"rows": "1024"}
    assert sha(s3.get_object(Bucket="origin", Key="attrs/big.bin")["Body"].read()) == sha(big)
    # a copy keeps them; a copy onto itself with REPLACE changes them and not the bytes
    s3.copy_object(Bucket="origin", Key="attrs/copy.tar",
                   CopySource={"Bucket": "origin", "Key": "attrs/shard-000.tar"})
    h = s3.head_object(Bucket="origin", Key="attrs/copy.tar")
    assert h["ContentType"] == "application/x-tar" and h["Metadata"] == meta
    s3.copy_object(Bucket="origin", Key="attrs/shard-000.tar", MetadataDirective="REPLACE",
                   CopySource={"Bucket": "origin", "Key": "attrs/shard-000.tar"},
                   ContentType="application/x-tar+v2", Metadata={"source": "laion-2b"})
    r = s3.get_object(Bucket="origin", Key="attrs/shard-000.tar")
    assert r["ContentType"] == "application/x-tar+v2" and r["Metadata"] == {"source": "laion-2b"}
    assert "CacheControl" not in r, "REPLACE drops what the request does not give"
    assert sha(r["Body"].read()) == sha(data)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="origin", Key="attrs/too-much", Body=b"x", Metadata={"k": "v" * 3000})
    assert code_of(e.value)[0] == "MetadataTooLarge"
    with pytest.raises(ClientError):
        s3.head_object(Bucket="origin", Key="attrs/too-much")
    # the aws cli sets Content-Type from the file name, and it is kept
    assert_aws_cp_keeps_json_type(gateway, tmp_path, "origin")


def assert_aws_cp_keeps_json_type(gateway, tmp_path, bucket):
    """`aws s3 cp` of a .json file sets its Content-Type from the name; the gateway keeps it."""
    f = tmp_path / "labels.json"
    f.write_text('{"a": 1}')
    aws = [os.path.join(VENV_BIN, "aws"), "--endpoint-url", gateway.endpoint, "s3"]
    subprocess.run(aws + ["cp", str(f), f"s3://{bucket}/attrs/labels.json"], env=env_for(gateway), check=True,
                   stdout=subprocess.DEVNULL)
    ct = gateway.client().head_object(Bucket=bucket, Key="attrs/labels.json")["ContentType"]
    assert ct == "application/json"


def test_object_attributes_on_a_local_directory_live_in_an_extended_attribute(gateway, tmp_path):
    """The local-directory bucket keeps the same attributes, in a `user.strata.attrs` extended attribute of each
    file: single PUT, multipart, copy, aws cli; an overwrite without them has none."""
    s3 = gateway.client()
    data = os.urandom(2 * 1024 * 1024 + 3)
    s3.put_object(Bucket="default", Key="attrs/a.tar", Body=data, ContentType="application/x-tar",
                  CacheControl="no-cache", Metadata={"Rows": "12", "split": "train"})
    meta = {"rows": "12", "split": "train"}
    stored = json.loads(os.getxattr(os.path.join(gateway.mount, "attrs", "a.tar"), "user.strata.attrs"))
    assert stored["content_type"] == "application/x-tar" and stored["user"] == meta
    for _ in range(2):  # cold, then from the cache
        r = s3.get_object(Bucket="default", Key="attrs/a.tar")
        assert sha(r["Body"].read()) == sha(data)
        assert r["ContentType"] == "application/x-tar" and r["CacheControl"] == "no-cache"
        assert r["Metadata"] == meta
    big = os.urandom(11 * 1024 * 1024)
    s3.upload_fileobj(io.BytesIO(big), "default", "attrs/big.bin",
                      ExtraArgs={"ContentType": "application/x-npy", "Metadata": {"rows": "1024"}},
                      Config=TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024))
    h = s3.head_object(Bucket="default", Key="attrs/big.bin")
    assert h["ContentType"] == "application/x-npy" and h["Metadata"] == {"rows": "1024"}
    s3.copy_object(Bucket="default", Key="attrs/b.tar", CopySource={"Bucket": "default", "Key": "attrs/a.tar"})
    assert s3.head_object(Bucket="default", Key="attrs/b.tar")["Metadata"] == meta
    s3.put_object(Bucket="default", Key="attrs/a.tar", Body=b"plain")
    h = s3.head_object(Bucket="default", Key="attrs/a.tar")
    assert "Metadata" not in h or h["Metadata"] == {}, "an overwrite without attributes has none"
    assert s3.head_object(Bucket="default", Key="attrs/b.tar")["Metadata"] == meta, "the copy keeps its own"
    assert_aws_cp_keeps_json_type(gateway, tmp_path, "default")


def test_aws_cli_cp_sync_ls(gateway, tmp_path):
    aws = [os.path.join(VENV_BIN, "aws"), "--endpoint-url", gateway.endpoint, "s3"]
    env = env_for(gateway)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(20):
        (src / ("sub" if i % 2 else "") / f"f{i}.bin").write_bytes(os.urandom(1000 + i * 5000))
    (src / "big.bin").write_bytes(os.urandom(20 * 1024 * 1024))
    subprocess.run(aws + ["cp", str(src / "big.bin"), "s3://origin/cli/big.bin"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(aws + ["cp", "s3://origin/cli/big.bin", str(tmp_path / "big.out")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    assert sha((tmp_path / "big.out").read_bytes()) == sha((src / "big.bin").read_bytes())
    subprocess.run(aws + ["sync", str(src), "s3://origin/sync/"], env=env, check=True, stdout=subprocess.DEVNULL)
    ls = subprocess.run(aws + ["ls", "--recursive", "s3://origin/sync/"], env=env, check=True,
                        capture_output=True, text=True).stdout
    listed = sorted(line.split()[-1] for line in ls.splitlines())
    assert listed == sorted("sync/" + k for k in tree(src))
    dst = tmp_path / "dst"
    for _ in range(2):  # cold, then from the cache
        subprocess.run(aws + ["sync", "s3://origin/sync/", str(dst)], env=env, check=True, stdout=subprocess.DEVNULL)
        assert tree(dst) == tree(src)
        subprocess.run(["rm", "-rf", str(dst)], check=True)
    # a second sync uploads nothing
    out = subprocess.run(aws + ["sync", str(src), "s3://origin/sync/"], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert "upload:" not in out


def test_s5cmd_cp_many_objects_concurrently(gateway, tmp_path):
    s5 = [os.path.join(VENV_BIN, "s5cmd"), "--endpoint-url", gateway.endpoint]
    env = env_for(gateway)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(300):
        (src / f"o{i:04}.bin").write_bytes(os.urandom(16 * 1024 + i))
    subprocess.run(s5 + ["--numworkers", "32", "cp", str(src) + "/*", "s3://default/s5/"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    for run in ("cold", "hot"):
        dst = tmp_path / run
        subprocess.run(s5 + ["--numworkers", "32", "cp", "s3://default/s5/*", str(dst) + "/"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        assert tree(dst) == tree(src), run


def test_checksums_are_enforced(gateway):
    s3 = gateway.client()
    import base64
    body = b"payload" * 1000
    good = base64.b64encode(hashlib.md5(body).digest()).decode()
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    s3.put_object(Bucket="default", Key="ck/good", Body=body, ContentMD5=good)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="default", Key="ck/bad", Body=body, ContentMD5=bad)
    assert code_of(e.value)[0] == "BadDigest"
    wrong_sha = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="default", Key="ck/bad2", Body=body, ChecksumSHA256=wrong_sha)
    assert code_of(e.value)[0] == "BadDigest"
    s3.put_object(Bucket="default", Key="ck/good2", Body=body, ChecksumAlgorithm="CRC32")
    for k in ("ck/bad", "ck/bad2"):
        with pytest.raises(ClientError):
            s3.head_object(Bucket="default", Key=k)
    assert s3.get_object(Bucket="default", Key="ck/good2")["Body"].read() == body


def signed_request(gw, method, path, body=b"", region="us-east-1", service="s3", secret=SECRET_KEY,
                   skew_minutes=0, tamper_body=None):
    """Sign a request with botocore's SigV4 (optionally with a skewed clock) and send it raw."""
    import datetime

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    real = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: real() + datetime.timedelta(minutes=skew_minutes)
    try:
        req = AWSRequest(method=method, url=gw.endpoint + path, data=body,
                         headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
        botocore.auth.S3SigV4Auth(Credentials(ACCESS_KEY, secret), service, region).add_auth(req)
    finally:
        botocore.auth.get_current_datetime = real
    data = tamper_body if tamper_body is not None else body
    r = urllib.request.Request(gw.endpoint + path, data=data if method == "PUT" else None, method=method,
                               headers=dict(req.headers.items()))
    try:
        with urllib.request.urlopen(r) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_sigv4_negatives_are_refused_and_change_nothing(gateway):
    s3 = gateway.client()
    s3.put_object(Bucket="default", Key="auth/obj", Body=b"secret bytes")
    status, body = signed_request(gateway, "GET", "/default/auth/obj")
    assert status == 200 and body == b"secret bytes", "the raw signer itself works"
    cases = {
        "wrong secret": dict(secret="not-the-secret-at-all"),
        "wrong region": dict(region="eu-west-1"),
        "wrong service": dict(service="ec2"),
        "clock skew": dict(skew_minutes=-20),
    }
    for name, kw in cases.items():
        status, body = signed_request(gateway, "GET", "/default/auth/obj", **kw)
        assert status == 403, (name, status, body)
        assert b"secret bytes" not in body
        status, body = signed_request(gateway, "PUT", "/default/auth/written-" + name.replace(" ", "-"),
                                      body=b"evil", **kw)
        assert status == 403, (name, status, body)
    code = {
        "wrong secret": b"SignatureDoesNotMatch",
        "clock skew": b"RequestTimeTooSkewed",
    }
    for name, want in code.items():
        assert want in signed_request(gateway, "GET", "/default/auth/obj", **cases[name])[1]
    # tampered payload: signed for one body, another sent
    status, body = signed_request(gateway, "PUT", "/default/auth/tampered", body=b"A" * 100, tamper_body=b"B" * 100)
    assert status in (400, 403), (status, body)
    # anonymous
    try:
        urllib.request.urlopen(gateway.endpoint + "/default/auth/obj")
        raise AssertionError("anonymous read allowed")
    except urllib.error.HTTPError as e:
        assert e.code == 403
    listing = [o["Key"] for o in s3.list_objects_v2(Bucket="default", Prefix="auth/").get("Contents", [])]
    assert listing == ["auth/obj"], "no refused request wrote anything"
    with pytest.raises(ClientError) as e:
        client(gateway.endpoint, region="eu-west-1").list_buckets()
    assert code_of(e.value)[1] == 403


TRAVERSAL = [
    "../canary.txt", "../../canary.txt", "a/../../canary.txt", "/canary.txt", "..", "./x", "a//b",
    "..\\canary.txt", "a\\..\\..\\canary.txt", "x\x00y", "%2e%2e/canary.txt", "..%2fcanary.txt",
    "%252e%252e%252fcanary.txt", "%2e%2e%2fcanary.txt",
]


def test_traversal_corpus_never_leaves_the_mount(gateway):
    s3 = gateway.client()
    before = set(os.listdir(gateway.data))
    for key in TRAVERSAL:
        for op in ("get", "put", "head", "delete"):
            try:
                if op == "get":
                    body = s3.get_object(Bucket="default", Key=key)["Body"].read()
                    assert b"must never be served" not in body, key
                elif op == "put":
                    s3.put_object(Bucket="default", Key=key, Body=b"overwritten")
                elif op == "head":
                    s3.head_object(Bucket="default", Key=key)
                else:
                    s3.delete_object(Bucket="default", Key=key)
            except ClientError as e:
                assert 400 <= code_of(e)[1] < 500, (key, op, e.response)
            except Exception as e:  # botocore refuses some keys itself (e.g. NUL); that is also a refusal
                assert "must never be served" not in str(e)
        # raw, unencoded paths too (signed, so they reach key validation)
        status, body = signed_request(gateway, "GET", "/default/" + key.replace("\x00", "%00"))
        assert b"must never be served" not in body and status >= 400, (key, status)
    assert gateway.canary_intact()
    assert set(os.listdir(gateway.data)) == before, "nothing was created next to the mount"
    # whatever literal names were accepted live inside the mount
    for d, _, files in os.walk(gateway.data):
        for f in files:
            p = os.path.realpath(os.path.join(d, f))
            assert p.startswith(os.path.realpath(gateway.data))


def test_killed_gateway_leaves_no_partial_objects(origin):
    gw = Gateway(origin)
    try:
        s3 = gw.client()
        acked = os.urandom(3 * 1024 * 1024)
        for bucket in BUCKETS:
            s3.put_object(Bucket=bucket, Key="kill/acked.bin", Body=acked)
        # a multipart upload killed between parts
        up = s3.create_multipart_upload(Bucket="origin", Key="kill/mp.bin")["UploadId"]
        s3.upload_part(Bucket="origin", Key="kill/mp.bin", UploadId=up, PartNumber=1, Body=os.urandom(5 << 20))
        gw.kill()
        gw.start()
        s3 = gw.client()
        # a PutObject killed mid-body: a slow 64 MiB upload through a raw socket
        import socket
        for bucket in BUCKETS:
            host, port = gw.endpoint.replace("http://", "").split(":")
            total = 64 * 1024 * 1024
            sock = socket.create_connection((host, int(port)))
            from botocore.awsrequest import AWSRequest
            from botocore.auth import S3SigV4Auth
            from botocore.credentials import Credentials
            req = AWSRequest(method="PUT", url=f"{gw.endpoint}/{bucket}/kill/partial.bin",
                             headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD", "content-length": str(total)})
            S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
            head = f"PUT /{bucket}/kill/partial.bin HTTP/1.1\r\nhost: {host}:{port}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in req.headers.items() if k.lower() != "host")
            sock.sendall((head + "\r\n").encode())
            sent = 0
            chunk = os.urandom(1 << 20)
            while sent < 40 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
            time.sleep(0.3)
            gw.kill()
            sock.close()
            gw.start()
            s3 = gw.client()
        for bucket in BUCKETS:
            assert sha(s3.get_object(Bucket=bucket, Key="kill/acked.bin")["Body"].read()) == sha(acked)
            with pytest.raises(ClientError) as e:
                s3.head_object(Bucket=bucket, Key="kill/partial.bin")
            assert code_of(e.value)[1] == 404
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="kill/").get("Contents", [])]
            assert keys == ["kill/acked.bin"], keys
        with pytest.raises(ClientError):
            s3.head_object(Bucket="origin", Key="kill/mp.bin")
        # the interrupted multipart upload can still be completed after the restart
        parts = s3.list_parts(Bucket="origin", Key="kill/mp.bin", UploadId=up)["Parts"]
        assert [p["PartNumber"] for p in parts] == [1]
        s3.upload_part(Bucket="origin", Key="kill/mp.bin", UploadId=up, PartNumber=2, Body=b"end")
        parts = s3.list_parts(Bucket="origin", Key="kill/mp.bin", UploadId=up)["Parts"]
        s3.complete_multipart_upload(Bucket="origin", Key="kill/mp.bin", UploadId=up, MultipartUpload={
            "Parts": [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in parts]})
        assert s3.head_object(Bucket="origin", Key="kill/mp.bin")["ContentLength"] == (5 << 20) + 3
    finally:
        gw.close()


def test_gateway_io_shows_in_metrics(gateway):
    s3 = gateway.client()
    s3.put_object(Bucket="default", Key="ev/x", Body=b"x" * 10)
    s3.get_object(Bucket="default", Key="ev/x")["Body"].read()
    metrics = api_get(gateway.api + "/metrics").read().decode()
    assert 'strata_io_requests_total{op="put",outcome="ok",tier="backend"}' in metrics


@pytest.mark.parametrize("bucket", ["default", "origin"])
def test_write_preconditions_are_honoured_or_refused_never_ignored(gateway, bucket):
    """A lost update is what a client relying on If-Match / If-None-Match gets when they are ignored: each
    conditional write or delete either holds its condition or is refused (501) with nothing changed."""
    s3 = gateway.client()
    key = "cond/obj.bin"
    etag = s3.put_object(Bucket=bucket, Key=key, Body=b"first")["ETag"]
    # PutObject: honoured.
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert code_of(e.value)[1] == 412, e.value.response
    # DeleteObject with a wrong If-Match: not deleted.
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket=bucket, Key=key, IfMatch='"not-the-etag"')
    assert code_of(e.value) == ("NotImplemented", 501), e.value.response
    # DeleteObjects entries with an ETag: not deleted.
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key, "ETag": '"not-the-etag"'}]})
    assert r.get("Errors") and r["Errors"][0]["Code"] == "NotImplemented", r
    # CompleteMultipartUpload with If-None-Match: * over an existing key: not overwritten.
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=b"m" * 100)
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, IfNoneMatch="*",
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    assert code_of(e.value) == ("NotImplemented", 501), e.value.response
    got = s3.get_object(Bucket=bucket, Key=key)
    assert got["Body"].read() == b"first" and got["ETag"] == etag
    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=up)
    s3.delete_object(Bucket=bucket, Key=key)


def test_origin_keys_and_metadata_are_taken_as_they_are(gateway, origin):
    """Keys S3 allows but Strata would not create (`x//y`, `./z`, `a/../b`, a folder marker `dir/`) and user
    metadata that is not UTF-8, put at the origin by other tools: every listing that covers them works, each
    reads back byte-exact, and the metadata comes back with its bytes kept (RFC 2047), never a 500."""
    import http.client
    import urllib.parse
    o = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    bodies = {
        "odd/x//y": b"double slash",
        "odd/./z": b"dot segment",
        "odd/a/../b": b"dot-dot segment",
        "odd/dir/": b"",
        "odd/dir/inside": b"under the marker",
        "odd/plain": b"plain",
    }
    for k, v in bodies.items():
        o.put_object(Bucket="gw-origin", Key=k, Body=v)
    # A metadata value that is not UTF-8, as a tool that writes raw header bytes leaves it (moto takes the
    # request unsigned).
    host, port = origin.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    conn.putrequest("PUT", "/gw-origin/odd/meta")
    conn.putheader("x-amz-meta-note", b"caf\xe9")
    conn.putheader("Content-Length", "4")
    conn.endheaders(b"meta")
    assert conn.getresponse().status == 200
    conn.close()
    bodies["odd/meta"] = b"meta"
    listed = {x["Key"] for x in o.list_objects_v2(Bucket="gw-origin", Prefix="odd/").get("Contents", [])}
    assert listed == set(bodies), listed  # the origin holds these exact keys

    s3 = gateway.client()
    got = {x["Key"]: x["Size"] for x in s3.list_objects_v2(Bucket="origin", Prefix="odd/")["Contents"]}
    assert got == {k: len(v) for k, v in bodies.items()}
    paged, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket="origin", Prefix="odd/", MaxKeys=2, **kw)
        paged += [x["Key"] for x in r.get("Contents", [])]
        if not r.get("IsTruncated"):
            break
        token = r["NextContinuationToken"]
    assert paged == sorted(bodies)
    r = s3.list_objects_v2(Bucket="origin", Prefix="odd/", Delimiter="/")
    assert {x["Key"] for x in r.get("Contents", [])} == {"odd/plain", "odd/meta"}
    assert {p["Prefix"] for p in r["CommonPrefixes"]} == {"odd/x/", "odd/./", "odd/a/", "odd/dir/"}
    r = s3.list_objects_v2(Bucket="origin", Prefix="odd/dir/", Delimiter="/")
    assert {x["Key"] for x in r["Contents"]} == {"odd/dir/", "odd/dir/inside"}
    r = s3.list_objects_v2(Bucket="origin", Prefix="odd/a/../")
    assert [x["Key"] for x in r["Contents"]] == ["odd/a/../b"]
    for k, v in bodies.items():
        assert s3.get_object(Bucket="origin", Key=k)["Body"].read() == v, k  # cold
        assert s3.get_object(Bucket="origin", Key=k)["Body"].read() == v, k  # from the cache
        assert s3.head_object(Bucket="origin", Key=k)["ContentLength"] == len(v), k
    meta = s3.head_object(Bucket="origin", Key="odd/meta")["Metadata"]
    assert meta == {"note": "=?ISO-8859-1?B?Y2Fm6Q==?="}, meta
    # The aws cli's recursive copy (what s3fs and rclone do too: list, then read every key).
    out = subprocess.run([os.path.join(VENV_BIN, "aws"), "s3", "ls", "--recursive", "s3://origin/odd/",
                          "--endpoint-url", gateway.endpoint],
                         env=dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                                  AWS_DEFAULT_REGION="us-east-1"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == len(bodies), out.stdout
    for k in bodies:
        o.delete_object(Bucket="gw-origin", Key=k)


def test_stale_incomplete_uploads_under_a_backend_are_aborted(origin):
    """A writer killed mid-upload leaves its parts at the store, billed and invisible. The agent aborts
    incomplete uploads under its configured backends once they are `abort_uploads_after_secs` old (by the
    server's date and since it first saw them), and never one outside its backends."""
    o = client(origin, ORIGIN_KEY, ORIGIN_SECRET)

    def uploads(bucket):
        return {u["UploadId"] for u in o.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}

    mine = o.create_multipart_upload(Bucket="gw-origin", Key="sweep/killed writer +%")["UploadId"]
    o.upload_part(Bucket="gw-origin", Key="sweep/killed writer +%", UploadId=mine, PartNumber=1,
                  Body=b"x" * (5 << 20))
    theirs = o.create_multipart_upload(Bucket="direct", Key="sweep/not-a-backend")["UploadId"]
    g = Gateway(origin, extra="[catalog]\nabort_uploads_after_secs = 3\n")
    try:
        # Just started: it has seen the upload for less than the threshold (moto dates every upload 2010,
        # so the server's date alone would abort it at once).
        assert mine in uploads("gw-origin")
        deadline = time.time() + 30
        while mine in uploads("gw-origin"):
            assert time.time() < deadline, "the stale upload was never aborted"
            time.sleep(0.2)
        assert theirs in uploads("direct")
    finally:
        g.close()
        o.abort_multipart_upload(Bucket="direct", Key="sweep/not-a-backend", UploadId=theirs)


UGLY = [c for c in map(chr, range(32, 127)) if c not in "/\\"] + ["é", "日本", "a b", "c%41d", "x+y"]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_listings_round_trip_every_printable_key_for_boto3_and_the_aws_cli(gateway, bucket, tmp_path):
    """botocore asks for EncodingType=url and decodes what it gets: the gateway must encode keys, prefixes,
    markers and delimiters, or `a+b` lists as `a b` and `c%41d` as `cAd` (and the aws cli's recursive copy
    fails with NoSuchKey). Every printable ASCII character, spaces and unicode, in V1 and V2, paged and
    delimited (by `/` and by another delimiter)."""
    s3 = gateway.client()
    root = f"enc-{bucket}/"
    keys = sorted({f"{root}k{c}v" for c in UGLY} | {f"{root}d{c}/leaf" for c in "+% #"})
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    listed = [x["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=root, PaginationConfig={"PageSize": 7}) for x in p.get("Contents", [])]
    assert listed == keys
    v1 = [x["Key"] for p in s3.get_paginator("list_objects").paginate(
        Bucket=bucket, Prefix=root, PaginationConfig={"PageSize": 7}) for x in p.get("Contents", [])]
    assert v1 == keys
    r = s3.list_objects_v2(Bucket=bucket, Prefix=root, Delimiter="/")
    assert {p["Prefix"] for p in r["CommonPrefixes"]} == {f"{root}d{c}/" for c in "+% #"}
    assert [x["Key"] for x in r["Contents"]] == [k for k in keys if k.count("/") == 1]
    # Any delimiter, not only '/': here every key with a '+' after the prefix rolls up.
    r = s3.list_objects_v2(Bucket=bucket, Prefix=root, Delimiter="+")
    assert {p["Prefix"] for p in r["CommonPrefixes"]} == {
        k[:k.index("+", len(root)) + 1] for k in keys if "+" in k[len(root):]} == {
        f"{root}k+", f"{root}d+", f"{root}kx+"}
    assert {x["Key"] for x in r["Contents"]} == {k for k in keys if "+" not in k[len(root):]}
    # Asked for explicitly, botocore leaves the encoding to the caller: S3's encoding, '/' kept.
    import urllib.parse
    raw = s3.list_objects(Bucket=bucket, Prefix=root, EncodingType="url")
    assert [x["Key"] for x in raw["Contents"]] == [urllib.parse.quote(k, safe="/-_.~") for k in keys]
    assert raw["Marker"] == ""
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket=bucket, Prefix=root, EncodingType="base64")
    assert code_of(e.value) == ("InvalidArgument", 400)
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION="us-east-1")
    out = subprocess.run([os.path.join(VENV_BIN, "aws"), "s3", "cp", "--recursive", f"s3://{bucket}/{root}",
                          str(tmp_path / "down"), "--endpoint-url", gateway.endpoint],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for k in keys:
        with open(tmp_path / "down" / k[len(root):], "rb") as f:
            assert f.read() == k.encode(), k
    for k in keys:
        s3.delete_object(Bucket=bucket, Key=k)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_keys_the_file_store_refused_are_stored(gateway, bucket):
    """`version#1` made the file store answer 500 (`Filenames containing trailing '/#\\d+/' are not
    supported`), and rclone retried for 20 minutes; a 256-byte segment is over a file name's limit."""
    s3 = gateway.client()
    keys = ["hash/version#1", "hash/v#12/x", "hash/" + "s" * 256, "hash/" + "é" * 200]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=k.encode())
    for k in keys:
        assert s3.get_object(Bucket=bucket, Key=k)["Body"].read() == k.encode(), k
    assert [x["Key"] for x in s3.list_objects_v2(Bucket=bucket, Prefix="hash/")["Contents"]] == sorted(keys)
    for k in keys:
        s3.delete_object(Bucket=bucket, Key=k)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="hash/")


def test_errors_name_their_request_and_never_where_data_lives(gateway, origin):
    """A failure tells the client what happened to its request, with a request id, never the agent's paths or
    its origins' internals (`NoSuchKey: GET file:///srv/.../nonexist bytes 0-8388607: Object at location
    /srv/... not found`); the details are in the agent's log under that id. A 304 names the version."""
    s3 = gateway.client()
    for bucket in BUCKETS:
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key="no/such/key")
        r = e.value.response
        assert code_of(e.value) == ("NoSuchKey", 404), r
        text = json.dumps(r)
        assert gateway.mount not in text and "file://" not in text and "127.0.0.1" not in text, text
        assert r["ResponseMetadata"]["RequestId"], r
        assert r["ResponseMetadata"]["HTTPHeaders"].get("x-amz-request-id") == r["ResponseMetadata"]["RequestId"]
        etag = s3.put_object(Bucket=bucket, Key="cond/304", Body=b"v1")["ETag"]
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket=bucket, Key="cond/304", IfNoneMatch=etag)
        h = e.value.response["ResponseMetadata"]["HTTPHeaders"]
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
        assert h.get("etag") == etag and h.get("last-modified"), h
    # A server-side failure: the client gets S3's words and an id; the log has the cause under the id.
    g = Gateway(origin, extra='[[backends]]\nname = "dead"\nurl = "s3://dead"\n[backends.options]\n'
                              'endpoint = "http://127.0.0.1:9"\naccess_key_id = "k"\nsecret_access_key = "s"\n')
    try:
        with pytest.raises(ClientError) as e:
            g.client().get_object(Bucket="dead", Key="k")
        r = e.value.response
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 503, r
        assert "127.0.0.1" not in json.dumps(r), r
        rid = r["ResponseMetadata"]["RequestId"]
    finally:
        g.stop()
        log = g.proc.stderr.read().decode()
        g.close()
    assert rid and rid in log and "127.0.0.1:9" in log, log[-2000:]


def test_list_buckets_dates_each_bucket(gateway):
    """With [[backends]] configured, ListBuckets dated every bucket 1970-01-01 (tools that sort or age
    buckets by date misread them): a local directory's creation, else the agent's first start."""
    import datetime
    buckets = gateway.client().list_buckets()["Buckets"]
    assert {b["Name"] for b in buckets} >= {"default", "origin"}
    for b in buckets:
        assert b["CreationDate"] > datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc), b
        assert b["CreationDate"] <= datetime.datetime.now(datetime.timezone.utc), b


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart_parts_resent_and_a_repeated_complete_are_what_s3_does(gateway, bucket):
    """A part uploaded again under its number replaces it (the last one wins); a CompleteMultipartUpload
    repeated with the same parts (a client retrying after a lost answer) answers 200 with the same ETag, as S3
    does, and changes nothing; with other parts it is NoSuchUpload."""
    s3 = gateway.client()
    key = "mpu/resent.bin"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    first = b"a" * (5 << 20)
    s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=first)
    again = b"b" * (5 << 20)
    p1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=1, Body=again)["ETag"]
    p2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=2, Body=b"tail")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 2, "ETag": p2}]}
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in listed] == [(1, p1), (2, p2)]
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == again + b"tail"
    repeat = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up, MultipartUpload=parts)
    assert repeat["ETag"] == done["ETag"]
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1}]})
    assert code_of(e.value) == ("NoSuchUpload", 404)
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == again + b"tail"
    s3.delete_object(Bucket=bucket, Key=key)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_list_multipart_uploads_shows_the_callers_uploads_paged_and_grouped(gateway, bucket):
    """ListMultipartUploads was 501 (tools that clean up stale uploads, or resume one, failed): the caller's
    uploads in progress, paged by key and upload-id markers, grouped by a delimiter, URL-encoded when asked;
    another access key's uploads are not shown (an upload belongs to the key that created it)."""
    from conftest import JOB_KEY, JOB_SECRET
    s3, other = gateway.client(), gateway.client(key=JOB_KEY, secret=JOB_SECRET)
    mine = [("lmu/a+b", s3.create_multipart_upload(Bucket=bucket, Key="lmu/a+b")["UploadId"]),
            ("lmu/a+b", s3.create_multipart_upload(Bucket=bucket, Key="lmu/a+b")["UploadId"]),
            ("lmu/d/x", s3.create_multipart_upload(Bucket=bucket, Key="lmu/d/x")["UploadId"]),
            ("lmu/d/y", s3.create_multipart_upload(Bucket=bucket, Key="lmu/d/y")["UploadId"])]
    theirs = other.create_multipart_upload(Bucket=bucket, Key="lmu/theirs")["UploadId"]
    try:
        got = [(u["Key"], u["UploadId"]) for p in s3.get_paginator("list_multipart_uploads").paginate(
            Bucket=bucket, Prefix="lmu/", PaginationConfig={"PageSize": 1}) for u in p.get("Uploads", [])]
        want = sorted(mine[:2], key=lambda u: [i for k, i in mine].index(u[1])) + mine[2:]
        assert sorted(got) == sorted(mine) and [k for k, _ in got] == [k for k, _ in want], got
        r = s3.list_multipart_uploads(Bucket=bucket, Prefix="lmu/", Delimiter="/")
        assert [u["Key"] for u in r["Uploads"]] == ["lmu/a+b", "lmu/a+b"]
        assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["lmu/d/"]
        assert [u["UploadId"] for u in other.list_multipart_uploads(Bucket=bucket, Prefix="lmu/")["Uploads"]] \
            == [theirs]
    finally:
        for k, i in mine:
            s3.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=i)
        other.abort_multipart_upload(Bucket=bucket, Key="lmu/theirs", UploadId=theirs)
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=bucket, Prefix="lmu/")


def test_local_directory_etags_are_content_md5s_as_s3_gives(gateway):
    """ETags of local-directory objects were the file store's `inode-mtime-size`, so rclone could not
    hash-check 306 of 307 files: a single-part object's ETag is its MD5 (PUT, GET, HEAD, listings, copies,
    conditions), a multipart one S3's MD5-of-part-MD5s form. (A file changed in place by another tool loses
    the recorded hash: conformance.rs, file_backend_conforms.)"""
    import hashlib
    s3 = gateway.client()
    body = b"hash me " * 1000
    md5 = '"' + hashlib.md5(body).hexdigest() + '"'
    assert s3.put_object(Bucket="default", Key="etag/one", Body=body)["ETag"] == md5
    assert s3.head_object(Bucket="default", Key="etag/one")["ETag"] == md5
    assert s3.get_object(Bucket="default", Key="etag/one")["ETag"] == md5
    assert s3.get_object(Bucket="default", Key="etag/one", IfMatch=md5)["Body"].read() == body
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="default", Key="etag/one", IfNoneMatch=md5)
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert s3.get_object(Bucket="default", Key="etag/one", Range="bytes=8-15", IfMatch=md5)["Body"].read() \
        == b"hash me "
    [listed] = s3.list_objects_v2(Bucket="default", Prefix="etag/one")["Contents"]
    assert listed["ETag"] == md5
    s3.copy_object(Bucket="default", Key="etag/copy", CopySource={"Bucket": "default", "Key": "etag/one"})
    assert s3.head_object(Bucket="default", Key="etag/copy")["ETag"] == md5
    # Multipart: S3's form, from the parts' MD5s.
    parts = [b"p" * (5 << 20), b"q" * 1000]
    up = s3.create_multipart_upload(Bucket="default", Key="etag/multi")["UploadId"]
    done = [{"PartNumber": i + 1, "ETag": s3.upload_part(Bucket="default", Key="etag/multi", UploadId=up,
                                                         PartNumber=i + 1, Body=p)["ETag"]}
            for i, p in enumerate(parts)]
    s3.complete_multipart_upload(Bucket="default", Key="etag/multi", UploadId=up,
                                 MultipartUpload={"Parts": done})
    want = '"' + hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + '-2"'
    assert s3.head_object(Bucket="default", Key="etag/multi")["ETag"] == want
    for k in ("etag/one", "etag/copy", "etag/multi"):
        s3.delete_object(Bucket="default", Key=k)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_keys_that_are_not_plain_paths_are_written_as_they_are(gateway, origin, bucket):
    """A folder marker `dir/` (what s3fs and consoles create), `x//y`, `./z`, `a/../b`: written through the
    gateway, they are those very keys at the origin (never `dir` or `x/y`), read back, and deleted."""
    s3 = gateway.client()
    keys = {"w/dir/": b"", "w/x//y": b"double", "w/./z": b"dot", "w/a/../b": b"dotdot", "w/dir": b"the file"}
    for k, v in keys.items():
        s3.put_object(Bucket=bucket, Key=k, Body=v, ContentType="text/x-odd", Metadata={"m": "1"})
    if bucket == "origin":
        at_origin = client(origin, ORIGIN_KEY, ORIGIN_SECRET).list_objects_v2(Bucket="gw-origin", Prefix="w/")
        assert sorted(x["Key"] for x in at_origin["Contents"]) == sorted(keys)
    for k, v in keys.items():
        got = s3.get_object(Bucket=bucket, Key=k)
        assert got["Body"].read() == v and got["ContentType"] == "text/x-odd" and got["Metadata"] == {"m": "1"}, k
    assert sorted(x["Key"] for x in s3.list_objects_v2(Bucket=bucket, Prefix="w/")["Contents"]) == sorted(keys)
    for k in keys:
        s3.delete_object(Bucket=bucket, Key=k)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="w/")


@pytest.mark.parametrize("bucket", ["default", "origin"])
def test_list_object_versions_of_an_unversioned_bucket(gateway, bucket):
    """Issue 44, finding 14: every bucket here is unversioned, and S3 lists those too (each object once, its
    version `null`, the latest): cleanup tools (ceph s3-tests' fixtures, rclone's `--s3-versions`) call it."""
    s3 = gateway.client()
    keys = [f"lov/{k}" for k in ("a b.txt", "c+d.txt", "e%f.txt", "dir/x.txt", "dir/y.txt", "ünï.txt")]
    for i, k in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=k, Body=b"v" * (i + 1))
    assert s3.get_bucket_versioning(Bucket=bucket).get("Status") is None
    seen, prefixes, kwargs = [], [], {}
    pages = 0
    while True:
        r = s3.list_object_versions(Bucket=bucket, Prefix="lov/", Delimiter="/", MaxKeys=2, **kwargs)
        pages += 1
        assert r.get("DeleteMarkers", []) == []
        for v in r.get("Versions", []):
            assert v["VersionId"] == "null" and v["IsLatest"] is True, v
            seen.append((v["Key"], v["Size"]))
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            break
        assert r["NextVersionIdMarker"] == "null"
        kwargs = {"KeyMarker": r["NextKeyMarker"], "VersionIdMarker": r["NextVersionIdMarker"]}
    assert pages >= 3
    assert sorted(seen) == sorted((k, i + 1) for i, k in enumerate(keys) if not k.startswith("lov/dir/"))
    assert prefixes == ["lov/dir/"]
    # the whole tree without a delimiter, as a cleanup lists it, then deletes each version
    r = s3.list_object_versions(Bucket=bucket, Prefix="lov/")
    assert sorted(v["Key"] for v in r["Versions"]) == sorted(keys)
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": v["Key"], "VersionId": v["VersionId"]}
                                                         for v in r["Versions"]]})
    assert s3.list_object_versions(Bucket=bucket, Prefix="lov/").get("Versions", []) == []
    with pytest.raises(ClientError) as e:
        s3.list_object_versions(Bucket=bucket, VersionIdMarker="null")
    assert code_of(e.value)[1] == 400


def test_a_get_cut_because_the_object_changed_is_logged(origin):
    """Issue 44, finding 15: a GET whose object changes at the origin while its body streams is cut (never two
    versions' bytes); the gateway's log says which object and why."""
    from botocore.exceptions import BotoCoreError
    from conftest import ORIGIN_KEY, ORIGIN_SECRET, client
    gw = Gateway(origin)
    direct = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    body = os.urandom(16 * 1024 * 1024)
    direct.put_object(Bucket="gw-origin", Key="cut/changing.bin", Body=body)
    try:
        s3 = gw.client()
        # The version is known to the gateway, its first block cached; then the object changes at the origin
        # (not through the gateway: its metadata still names the old version).
        head = s3.get_object(Bucket="origin", Key="cut/changing.bin", Range="bytes=0-1023")["Body"].read()
        assert head == body[:1024]
        direct.put_object(Bucket="gw-origin", Key="cut/changing.bin", Body=os.urandom(len(body)))
        got, cut = b"", None
        try:
            stream = s3.get_object(Bucket="origin", Key="cut/changing.bin")["Body"]
            while chunk := stream.read(1024 * 1024):
                got += chunk
        except (BotoCoreError, ClientError, OSError) as e:
            cut = e
        assert body.startswith(got), "bytes of another version"
        assert cut is not None or got == b"", f"the whole old version came ({len(got)} bytes) and no error"
    finally:
        gw.close()
    log = gw.proc.stderr.read().decode(errors="replace")
    if got:
        assert "a GET was cut mid-body" in log and "cut/changing.bin" in log, log[-3000:]
