"""CreateBucket, HeadBucket, ListBuckets and DeleteBucket under `[gateway] bucket_root`, for a directory root
and an S3-prefix root, with boto3 and the aws cli: names validated as S3 does, buckets owned by the creating
team (charged to its quota, invisible and closed to other teams), configured backends untouched."""
import os
import subprocess

import pytest
from botocore.exceptions import ClientError

from conftest import ACCESS_KEY, ORIGIN_KEY, ORIGIN_SECRET, SECRET_KEY, VENV_BIN, Gateway, client
from test_tenancy import cli, cli_json, s3_for, used


def code_of(e):
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(scope="module", params=["dir", "s3"])
def rooted(origin, request):
    if request.param == "dir":
        root_dir = None
        gw = Gateway(origin, gateway_extra="bucket_root = \"file://{root}\"".format(root="/tmp/placeholder"))
        # a directory inside the gateway's own temp dir
        gw.stop()
        root_dir = os.path.join(gw.dir, "buckets")
        os.makedirs(root_dir)
        with open(gw.cfg) as f:
            cfg = f.read().replace("file:///tmp/placeholder", f"file://{root_dir}")
        with open(gw.cfg, "w") as f:
            f.write(cfg)
        gw.start()
    else:
        gw = Gateway(origin, gateway_extra=f"""bucket_root = "s3://gw-buckets/made"
[gateway.bucket_root_options]
endpoint = "{origin}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
""")
        root_dir = None
    yield gw, request.param, root_dir
    gw.close()


def test_create_use_list_and_delete_a_bucket(rooted, origin):
    gw, kind, root_dir = rooted
    s3 = gw.client()
    name = f"made-{kind}-1"
    s3.create_bucket(Bucket=name)
    s3.head_bucket(Bucket=name)
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    created = [b for b in s3.list_buckets()["Buckets"] if b["Name"] == name][0]["CreationDate"]
    assert created.year >= 2026
    data = os.urandom(200_000)
    s3.put_object(Bucket=name, Key="a/b c+d.bin", Body=data)
    assert s3.get_object(Bucket=name, Key="a/b c+d.bin")["Body"].read() == data
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=name)["Contents"]] == ["a/b c+d.bin"]
    # where it lives
    if kind == "dir":
        assert open(os.path.join(root_dir, name, "a", "b c+d.bin"), "rb").read() == data
    else:
        direct = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
        assert direct.get_object(Bucket="gw-buckets", Key=f"made/{name}/a/b c+d.bin")["Body"].read() == data
    # again by its owner: us-east-1 answers 200, as S3 there
    s3.create_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=name)
    assert code_of(e.value) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=name, Key="a/b c+d.bin")
    s3.delete_bucket(Bucket=name)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=name)
    assert code_of(e.value)[1] == 404
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=name, Key="x", Body=b"x")
    assert code_of(e.value) == ("NoSuchBucket", 404)
    assert name not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    if kind == "dir":
        assert not os.path.exists(os.path.join(root_dir, name))


def test_bucket_names_are_checked_as_s3_does(rooted):
    gw, kind, _ = rooted
    s3 = gw.client()
    # (the last four name quota scopes of their own: a bucket there would be charged as pinned cache,
    # scratch, checkpoints or peer replicas)
    for bad in ["ab", "Upper", "a..b", "-lead", "trail-", "192.168.1.1", "x" * 64, "under_score", "xn--abc",
                "name-s3alias", "cache", "scratch", "ckpt", "peer"]:
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket=bad)
        assert code_of(e.value) == ("InvalidBucketName", 400), bad
    # a configured backend is every caller's bucket already: as S3 answers its owner in us-east-1
    s3.create_bucket(Bucket="origin", ACL="private")
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=f"made-{kind}-loc", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert code_of(e.value)[1] == 400
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket="default")
    assert code_of(e.value)[1] == 403


def test_the_aws_cli_makes_and_removes_buckets(rooted, tmp_path):
    gw, kind, _ = rooted
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    aws = [os.path.join(VENV_BIN, "aws"), "--endpoint-url", gw.endpoint, "s3"]
    name = f"cli-{kind}-bucket"
    subprocess.run(aws + ["mb", f"s3://{name}"], env=env, check=True, capture_output=True)
    src = tmp_path / "tree"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f 1.txt").write_bytes(b"one")
    (src / "g+%.txt").write_bytes(b"two")
    subprocess.run(aws + ["sync", str(src), f"s3://{name}/"], env=env, check=True, capture_output=True)
    out = subprocess.run(aws + ["ls", "--recursive", f"s3://{name}/"], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert sorted(line.split(maxsplit=3)[3] for line in out.splitlines()) == ["d/f 1.txt", "g+%.txt"]
    subprocess.run(aws + ["rb", "--force", f"s3://{name}"], env=env, check=True, capture_output=True)
    out = subprocess.run(aws + ["ls"], env=env, check=True, capture_output=True, text=True).stdout
    assert name not in out


def test_a_bucket_belongs_to_the_team_that_made_it(rooted):
    gw, kind, _ = rooted
    for t in ("vision", "nlp"):
        cli(gw, "team", "create", t, check=False)
    keys = {t: cli_json(gw, "token", "create", "--name", f"{t}-{kind}-b", "--team", t, "--s3")
            for t in ("vision", "nlp")}
    reader = cli_json(gw, "token", "create", "--name", f"nlp-{kind}-reader", "--team", "nlp", "--role", "reader",
                      "--s3")
    v, n = s3_for(gw, keys["vision"]), s3_for(gw, keys["nlp"])
    name = f"team-{kind}-v"
    v.create_bucket(Bucket=name)
    v.put_object(Bucket=name, Key="k", Body=b"x" * 1000)
    # charged to vision, in the bucket's scope
    assert used(gw, "vision", scope=name)["used_bytes"] == 1000
    # another team: not listed, not readable, not writable, not deletable
    assert name not in [b["Name"] for b in n.list_buckets()["Buckets"]]
    for call in (lambda: n.get_object(Bucket=name, Key="k"), lambda: n.put_object(Bucket=name, Key="j", Body=b"y"),
                 lambda: n.head_bucket(Bucket=name), lambda: n.delete_bucket(Bucket=name),
                 lambda: n.list_objects_v2(Bucket=name)["Contents"]):
        with pytest.raises((ClientError, KeyError)) as e:
            call()
        if isinstance(e.value, ClientError):
            assert code_of(e.value)[1] == 403
    # the same name is taken
    with pytest.raises(ClientError) as e:
        n.create_bucket(Bucket=name)
    assert code_of(e.value) == ("BucketAlreadyExists", 409)
    # a reader may not make buckets
    with pytest.raises(ClientError) as e:
        s3_for(gw, reader).create_bucket(Bucket=f"reader-{kind}-b")
    assert code_of(e.value) == ("AccessDenied", 403)
    v.delete_object(Bucket=name, Key="k")
    v.delete_bucket(Bucket=name)


def test_a_limit_on_the_bucket_root_binds_every_bucket_the_team_made(rooted):
    """Issue 44, item 5: each created bucket is a quota scope of its own, and nothing but the team's total bound
    them together: a team limited on its backend made buckets and wrote past it. `bucket_root` is the scope of
    every bucket a team made, together: a limit there binds them all, counts what they held before it was set,
    and gives back what is deleted."""
    gw, kind, _ = rooted
    team = f"roots-{kind}"
    cli(gw, "team", "create", team)
    key = cli_json(gw, "token", "create", "--name", f"{team}-w", "--team", team, "--s3")
    s3 = s3_for(gw, key)
    one, two = f"{team}-one", f"{team}-two"
    s3.create_bucket(Bucket=one)
    s3.create_bucket(Bucket=two)
    s3.put_object(Bucket=one, Key="before", Body=b"a" * 400_000)
    cli(gw, "quota", "set", team, "--scope", "bucket_root", "--hard-bytes", "1000000")
    assert used(gw, team, scope="bucket_root")["used_bytes"] == 400_000
    s3.put_object(Bucket=two, Key="fits", Body=b"b" * 500_000)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=two, Key="over", Body=b"c" * 200_000)
    assert code_of(e.value) == ("QuotaExceeded", 403)
    # A third bucket is bound by it too; multipart parts are admitted against it.
    three = f"{team}-three"
    s3.create_bucket(Bucket=three)
    up = s3.create_multipart_upload(Bucket=three, Key="parts")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part(Bucket=three, Key="parts", UploadId=up, PartNumber=1, Body=b"d" * 200_000)
    assert code_of(e.value) == ("QuotaExceeded", 403)
    s3.abort_multipart_upload(Bucket=three, Key="parts", UploadId=up)
    with pytest.raises(ClientError):
        s3.head_object(Bucket=two, Key="over")
    # Deleting gives back: the write fits now.
    s3.delete_object(Bucket=one, Key="before")
    s3.put_object(Bucket=two, Key="over", Body=b"c" * 200_000)
    q = used(gw, team, scope="bucket_root")
    assert (q["used_bytes"], q["used_objects"], q["reserved_bytes"]) == (700_000, 2, 0), q
    assert used(gw, team, scope="*")["used_bytes"] == 700_000
    for b, k in ((two, "fits"), (two, "over")):
        s3.delete_object(Bucket=b, Key=k)
    for b in (one, two, three):
        s3.delete_bucket(Bucket=b)
    assert used(gw, team, scope="bucket_root")["used_bytes"] == 0


def test_without_a_bucket_root_create_bucket_is_not_implemented(gateway):
    s3 = gateway.client()
    s3.create_bucket(Bucket="default")
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket="would-be-new")
    assert code_of(e.value) == ("NotImplemented", 501)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket="would-be-new")
    assert code_of(e.value)[1] == 404


def test_configured_team_keys_keep_to_their_team_and_root_buckets_to_root(origin, tmp_path):
    """Issue 44, finding 2: a `[[gateway.keys]]` key that names a team is that team's, not root: another
    team's key neither lists, reads, writes, deletes in nor deletes its bucket (ceph s3-tests' main and alt
    users), a listing of it is 403 (not an empty 200), and a bucket made by a key with no team is root's
    alone."""
    root_dir = tmp_path / "buckets"
    root_dir.mkdir()
    keys = {"main": ("s3mainkey", "s3mainsecret"), "alt": ("s3altkey", "s3altsecret"),
            "root": ("s3rootkey", "s3rootsecret")}
    gw = Gateway(origin, gateway_extra=f'bucket_root = "file://{root_dir}"', extra=f"""
[[gateway.keys]]
access_key = "{keys['main'][0]}"
secret_key = "{keys['main'][1]}"
team = "s3main"
[[gateway.keys]]
access_key = "{keys['alt'][0]}"
secret_key = "{keys['alt'][1]}"
team = "s3alt"
[[gateway.keys]]
access_key = "{keys['root'][0]}"
secret_key = "{keys['root'][1]}"
""")
    try:
        for t in ("s3main", "s3alt"):
            cli(gw, "team", "create", t)
        c = {who: s3_for(gw, {"access_key": k, "secret_key": s}) for who, (k, s) in keys.items()}
        c["main"].create_bucket(Bucket="main-bucket")
        c["main"].put_object(Bucket="main-bucket", Key="k", Body=b"main's")
        c["root"].create_bucket(Bucket="root-bucket")
        c["root"].put_object(Bucket="root-bucket", Key="k", Body=b"root's")
        for who, bucket in (("alt", "main-bucket"), ("alt", "root-bucket"), ("main", "root-bucket")):
            s3 = c[who]
            for name, call in (
                ("list v2", lambda: s3.list_objects_v2(Bucket=bucket)),
                ("list v1", lambda: s3.list_objects(Bucket=bucket)),
                ("uploads", lambda: s3.list_multipart_uploads(Bucket=bucket)),
                ("get", lambda: s3.get_object(Bucket=bucket, Key="k")),
                ("head", lambda: s3.head_object(Bucket=bucket, Key="k")),
                ("put", lambda: s3.put_object(Bucket=bucket, Key="new", Body=b"x")),
                ("overwrite", lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"x")),
                ("delete", lambda: s3.delete_object(Bucket=bucket, Key="k")),
                ("mpu", lambda: s3.create_multipart_upload(Bucket=bucket, Key="m")),
                ("delete bucket", lambda: s3.delete_bucket(Bucket=bucket)),
            ):
                with pytest.raises(ClientError) as e:
                    call()
                assert code_of(e.value)[1] == 403, (who, bucket, name, e.value.response)
            assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]], (who, bucket)
        # nothing changed, and the owners still do everything
        assert c["main"].get_object(Bucket="main-bucket", Key="k")["Body"].read() == b"main's"
        assert c["root"].get_object(Bucket="root-bucket", Key="k")["Body"].read() == b"root's"
        assert [o["Key"] for o in c["main"].list_objects_v2(Bucket="main-bucket")["Contents"]] == ["k"]
        assert sorted(os.listdir(root_dir / "main-bucket")) == ["k"]
        c["main"].delete_object(Bucket="main-bucket", Key="k")
        c["main"].delete_bucket(Bucket="main-bucket")
    finally:
        gw.close()


def _slow_put(gw, bucket, key, total):
    """A PUT whose body is still arriving: headers and half the body sent through a raw socket, signed with
    the test's key. Returns (socket, rest of the body)."""
    import socket
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from conftest import ACCESS_KEY, SECRET_KEY
    import hashlib
    host, port = gw.endpoint.replace("http://", "").split(":")
    body = b"L" * total
    req = AWSRequest(method="PUT", url=f"{gw.endpoint}/{bucket}/{key}", data=body,
                     headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
                              "content-length": str(total)})
    S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    head = f"PUT /{bucket}/{key} HTTP/1.1\r\nhost: {host}:{port}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in req.headers.items() if k.lower() != "host") + "\r\n"
    sock = socket.create_connection((host, int(port)))
    sock.sendall(head.encode())
    sock.sendall(body[:total // 2])
    return sock, body[total // 2:]


def _answer(sock):
    sock.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    assert data, "no answer"
    return int(data.split(b" ", 2)[1]), data


def test_delete_bucket_and_a_put_in_flight_never_leave_an_object_behind(rooted):
    """Issue 44, finding 3: DeleteBucket while a PUT's body is still arriving is refused (the write is in
    progress), the PUT lands; and a bucket deleted once it is empty takes nothing with it to the next team
    that makes its name."""
    gw, kind, root_dir = rooted
    s3 = gw.client()
    name = f"race-{kind}"
    s3.create_bucket(Bucket=name)
    for _ in range(3):
        sock, rest = _slow_put(gw, name, "late.bin", 4 << 20)
        # the PUT's half body is in; the gateway is reading it
        with pytest.raises(ClientError) as e:
            s3.delete_bucket(Bucket=name)
        assert code_of(e.value) == ("BucketNotEmpty", 409), e.value.response
        sock.sendall(rest)
        status, raw = _answer(sock)
        assert status == 200, raw
        assert len(s3.get_object(Bucket=name, Key="late.bin")["Body"].read()) == 4 << 20
        s3.delete_object(Bucket=name, Key="late.bin")
    s3.delete_bucket(Bucket=name)
    # another team makes the name: it finds nothing
    cli(gw, "team", "create", "racers", check=False)
    other = s3_for(gw, cli_json(gw, "token", "create", "--name", f"racer-{kind}", "--team", "racers", "--s3"))
    other.create_bucket(Bucket=name)
    assert other.list_objects_v2(Bucket=name).get("Contents", []) == []
    with pytest.raises(ClientError) as e:
        other.get_object(Bucket=name, Key="late.bin")
    assert code_of(e.value)[1] == 404
    other.delete_bucket(Bucket=name)


def test_a_put_into_a_bucket_another_agent_deleted_meanwhile_keeps_nothing(rooted):
    """Issue 44, finding 3, across agents: the bucket's record leaves the shared catalog (DeleteBucket through
    another agent) while a PUT's body is arriving here: the PUT answers 404 NoSuchBucket and its object is
    gone, so the next team to make the name finds nothing."""
    import sqlite3
    gw, kind, root_dir = rooted
    s3 = gw.client()
    name = f"race-x-{kind}"
    s3.create_bucket(Bucket=name)
    sock, rest = _slow_put(gw, name, "late.bin", 4 << 20)
    db = sqlite3.connect(os.path.join(gw.data, "catalog.db"), timeout=30)
    db.execute("DELETE FROM buckets WHERE name = ?", (name,))
    db.commit()
    db.close()
    sock.sendall(rest)
    status, raw = _answer(sock)
    assert status == 404 and b"NoSuchBucket" in raw, raw
    if kind == "dir":
        left = [os.path.join(d, f) for d, _, fs in os.walk(root_dir) for f in fs if name in d]
        assert left == [], left
    else:
        direct = client(gw_origin_endpoint(gw), ORIGIN_KEY, ORIGIN_SECRET)
        assert direct.list_objects_v2(Bucket="gw-buckets", Prefix=f"made/{name}/").get("Contents", []) == []


def gw_origin_endpoint(gw):
    with open(gw.cfg) as f:
        for line in f:
            if line.strip().startswith("endpoint"):
                return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no endpoint in the configuration")


def test_embedded_defaults_make_buckets_under_the_data_dir(tmp_path):
    """Issue 44, finding 15: `strata serve` with no configuration makes buckets (under `<data-dir>/buckets`), as
    MinIO would; `bucket_root = ""` turns that off."""
    import subprocess
    import time
    import boto3
    from botocore.config import Config
    from conftest import STRATA
    data = tmp_path / "data"
    env = dict(os.environ, STRATA_ACCESS_KEY="embeddedkey", STRATA_SECRET_KEY="embeddedsecret", STRATA_LOG="warn")
    proc = subprocess.Popen([STRATA, "serve", "--data-dir", str(data), "--api-listen", "127.0.0.1:0",
                             "--s3-listen", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        addr = data / "s3.addr"
        deadline = time.time() + 30
        while not (addr.exists() and addr.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "strata serve did not start"
            time.sleep(0.05)
        s3 = boto3.client("s3", endpoint_url=addr.read_text().strip(), aws_access_key_id="embeddedkey",
                          aws_secret_access_key="embeddedsecret", region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="my-data")
        s3.put_object(Bucket="my-data", Key="a b+c.txt", Body=b"hello")
        assert s3.get_object(Bucket="my-data", Key="a b+c.txt")["Body"].read() == b"hello"
        assert (data / "buckets" / "my-data" / "a b+c.txt").read_bytes() == b"hello"
        assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == {"default", "my-data"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
