"""S3 details clients rely on, through boto3 against both bucket kinds (a local directory and an S3 origin):
checksums kept and returned (PUT, multipart composite and full-object, ListParts, GET/HEAD with checksum mode,
GetObjectAttributes), part reads (`partNumber`, `PartsCount`), UploadPartCopy, CopyObject's ETag and
checksum, `Expires`, and multipart uploads and copies of keys no plain path can hold."""
import base64
import datetime
import hashlib
import os
import zlib

import pytest
from botocore.exceptions import ClientError

BUCKETS = ["default", "origin"]
MIB = 1024 * 1024


def code_of(e):
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


def b64(raw):
    return base64.b64encode(raw).decode()


def sha256_b64(data):
    return b64(hashlib.sha256(data).digest())


def crc32_b64(data):
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def md5_hex(data):
    return hashlib.md5(data).hexdigest()


def multipart(s3, bucket, key, parts, **create):
    """Upload `parts` (bytes each) as a multipart upload; returns (Complete's answer, the parts' answers)."""
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)
    uid = up["UploadId"]
    alg = create.get("ChecksumAlgorithm")
    answers = []
    for i, p in enumerate(parts, 1):
        kw = {"ChecksumAlgorithm": alg} if alg else {}
        answers.append(s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i, Body=p, **kw))
    listed = []
    for i, a in enumerate(answers, 1):
        entry = {"PartNumber": i, "ETag": a["ETag"]}
        if alg:
            entry["Checksum" + alg] = a["Checksum" + alg]
        listed.append(entry)
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                        MultipartUpload={"Parts": listed})
    return up, done, answers


@pytest.mark.parametrize("bucket", BUCKETS)
def test_put_checksum_is_kept_and_returned_with_checksum_mode(gateway, bucket):
    s3 = gateway.client()
    data = os.urandom(100_000)
    put = s3.put_object(Bucket=bucket, Key="sums/put.bin", Body=data, ChecksumAlgorithm="SHA256")
    assert put["ChecksumSHA256"] == sha256_b64(data)
    head = s3.head_object(Bucket=bucket, Key="sums/put.bin", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == sha256_b64(data)
    assert head.get("ChecksumType") == "FULL_OBJECT"
    got = s3.get_object(Bucket=bucket, Key="sums/put.bin", ChecksumMode="ENABLED")
    assert got["ChecksumSHA256"] == sha256_b64(data)
    assert got["Body"].read() == data
    # Without checksum mode, none is sent (as S3).
    assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="sums/put.bin")
    # CRC32 by header value, as a client that computed it up front sends it.
    s3.put_object(Bucket=bucket, Key="sums/crc.bin", Body=data, ChecksumCRC32=crc32_b64(data))
    head = s3.head_object(Bucket=bucket, Key="sums/crc.bin", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc32_b64(data)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_a_checksum_that_does_not_match_stores_nothing(gateway, bucket):
    s3 = gateway.client()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=bucket, Key="sums/bad.bin", Body=b"hello",
                      ChecksumSHA256=sha256_b64(b"other"))
    assert code_of(e.value)[1] == 400
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="sums/bad.bin")
    assert code_of(e.value)[1] == 404


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart_composite_checksum_parts_and_part_reads(gateway, bucket):
    s3 = gateway.client()
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(1234)]
    key = "sums/composite.bin"
    up, done, answers = multipart(s3, bucket, key, parts, ChecksumAlgorithm="SHA256")
    assert up.get("ChecksumAlgorithm") == "SHA256"
    assert [a["ChecksumSHA256"] for a in answers] == [sha256_b64(p) for p in parts]
    composite = b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()) + "-3"
    assert done["ChecksumSHA256"] == composite
    assert done.get("ChecksumType") == "COMPOSITE"
    # ETag as S3 computes a multipart one.
    want_etag = md5_hex(b"".join(hashlib.md5(p).digest() for p in parts)) + "-3"
    assert done["ETag"].strip('"') == want_etag
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == composite
    assert head["ETag"].strip('"') == want_etag
    assert "PartsCount" not in head
    # partNumber: each part's bytes, its checksum, and PartsCount.
    for n, p in enumerate(parts, 1):
        got = s3.get_object(Bucket=bucket, Key=key, PartNumber=n, ChecksumMode="ENABLED")
        assert got["Body"].read() == p
        assert got["PartsCount"] == 3
        assert got["ContentLength"] == len(p)
        assert got["ChecksumSHA256"] == sha256_b64(p)
        h = s3.head_object(Bucket=bucket, Key=key, PartNumber=n)
        assert h["PartsCount"] == 3 and h["ContentLength"] == len(p)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key=key, PartNumber=4)
    assert code_of(e.value) == ("InvalidPartNumber", 416)
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=bucket, Key=key, PartNumber=1, Range="bytes=0-1")
    assert code_of(e.value)[1] == 400
    # GetObjectAttributes: ETag, size, checksum (without the parts suffix), parts paged.
    attrs = s3.get_object_attributes(Bucket=bucket, Key=key,
                                     ObjectAttributes=["ETag", "Checksum", "ObjectParts", "StorageClass",
                                                       "ObjectSize"], MaxParts=2)
    assert attrs["ETag"] == want_etag, "bare, as S3 sends it there"
    assert attrs["ObjectSize"] == sum(map(len, parts))
    assert attrs["StorageClass"] == "STANDARD"
    assert attrs["Checksum"]["ChecksumSHA256"] == composite
    op = attrs["ObjectParts"]
    assert op["TotalPartsCount"] == 3 and op["IsTruncated"] is True and op["NextPartNumberMarker"] == 2
    assert [(p["PartNumber"], p["Size"]) for p in op["Parts"]] == [(1, 5 * MIB), (2, 5 * MIB)]
    assert op["Parts"][0]["ChecksumSHA256"] == sha256_b64(parts[0])
    rest = s3.get_object_attributes(Bucket=bucket, Key=key, ObjectAttributes=["ObjectParts"],
                                    PartNumberMarker=2)["ObjectParts"]
    assert [p["PartNumber"] for p in rest["Parts"]] == [3] and rest["IsTruncated"] is False


@pytest.mark.parametrize("bucket", BUCKETS)
def test_multipart_full_object_crc_and_list_parts(gateway, bucket):
    s3 = gateway.client()
    parts = [os.urandom(5 * MIB), os.urandom(777)]
    key = "sums/full.bin"
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32",
                                    ChecksumType="FULL_OBJECT")
    assert up.get("ChecksumType") == "FULL_OBJECT"
    uid = up["UploadId"]
    etags = []
    for i, p in enumerate(parts, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=i, Body=p, ChecksumCRC32=crc32_b64(p))
        etags.append(r["ETag"])
    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
    assert [p["ChecksumCRC32"] for p in listed["Parts"]] == [crc32_b64(p) for p in parts]
    assert listed.get("ChecksumAlgorithm") == "CRC32" and listed.get("ChecksumType") == "FULL_OBJECT"
    whole = b"".join(parts)
    # A full-object checksum that does not match is refused; the upload stays to complete right.
    with pytest.raises(ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, ChecksumCRC32=crc32_b64(b"x"),
                                     ChecksumType="FULL_OBJECT",
                                     MultipartUpload={"Parts": [{"PartNumber": i, "ETag": t}
                                                                for i, t in enumerate(etags, 1)]})
    assert code_of(e.value)[1] == 400
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, ChecksumCRC32=crc32_b64(whole),
                                        ChecksumType="FULL_OBJECT",
                                        MultipartUpload={"Parts": [{"PartNumber": i, "ETag": t}
                                                                   for i, t in enumerate(etags, 1)]})
    assert done["ChecksumCRC32"] == crc32_b64(whole)
    assert done.get("ChecksumType") == "FULL_OBJECT"
    # A repeated complete answers the same, checksum included.
    again = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, ChecksumType="FULL_OBJECT",
                                         MultipartUpload={"Parts": [{"PartNumber": i, "ETag": t}
                                                                    for i, t in enumerate(etags, 1)]})
    assert again["ETag"] == done["ETag"] and again["ChecksumCRC32"] == done["ChecksumCRC32"]
    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc32_b64(whole) and head.get("ChecksumType") == "FULL_OBJECT"
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == whole


@pytest.mark.parametrize("bucket", BUCKETS)
def test_a_reuploaded_part_is_the_last_one_sent(gateway, bucket):
    s3 = gateway.client()
    key = "parts/again.bin"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    first, second = os.urandom(5 * MIB), os.urandom(5 * MIB)
    s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=first)
    e1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=second)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, Body=b"tail")["ETag"]
    assert len(s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)["Parts"]) == 2
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1},
                                                            {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == second + b"tail"


@pytest.mark.parametrize("bucket", BUCKETS)
def test_upload_part_copy_ranges_and_conditions(gateway, bucket):
    s3 = gateway.client()
    src = os.urandom(12 * MIB + 5)
    s3.put_object(Bucket=bucket, Key="pcopy/src.bin", Body=src)
    src_etag = s3.head_object(Bucket=bucket, Key="pcopy/src.bin")["ETag"]
    key = "pcopy/dst.bin"
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32")["UploadId"]
    source = {"Bucket": bucket, "Key": "pcopy/src.bin"}
    p1 = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, CopySource=source,
                             CopySourceRange=f"bytes=0-{6 * MIB - 1}", CopySourceIfMatch=src_etag)
    assert p1["CopyPartResult"]["ETag"].strip('"') == md5_hex(src[:6 * MIB])
    assert p1["CopyPartResult"]["ChecksumCRC32"] == crc32_b64(src[:6 * MIB])
    p2 = s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=2, CopySource=source,
                             CopySourceRange=f"bytes={6 * MIB}-{len(src) - 1}")
    # Conditions that fail, a range outside the source, a source the caller cannot name: refused.
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3, CopySource=source,
                            CopySourceIfMatch='"0000"')
    assert code_of(e.value) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3, CopySource=source,
                            CopySourceIfNoneMatch=src_etag)
    assert code_of(e.value) == ("PreconditionFailed", 412)
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3, CopySource=source,
                            CopySourceRange=f"bytes=0-{len(src)}")
    assert code_of(e.value) == ("InvalidRange", 400)
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key=key, UploadId=uid, PartNumber=3,
                            CopySource={"Bucket": bucket, "Key": "pcopy/missing"})
    assert code_of(e.value)[1] == 404
    parts = [{"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"],
              "ChecksumCRC32": p1["CopyPartResult"]["ChecksumCRC32"]},
             {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"],
              "ChecksumCRC32": p2["CopyPartResult"]["ChecksumCRC32"]}]
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == src
    assert s3.get_object(Bucket=bucket, Key=key, PartNumber=2)["Body"].read() == src[6 * MIB:]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_copy_object_keeps_s3_etag_semantics_and_the_checksum(gateway, bucket):
    s3 = gateway.client()
    data = os.urandom(300_000)
    s3.put_object(Bucket=bucket, Key="copy/plain.bin", Body=data, ChecksumAlgorithm="SHA256",
                  ContentType="text/x-a", Metadata={"a": "1"})
    # Onto itself with new metadata: still a plain MD5 ETag, same checksum, new attributes.
    r = s3.copy_object(Bucket=bucket, Key="copy/plain.bin", CopySource={"Bucket": bucket, "Key": "copy/plain.bin"},
                       MetadataDirective="REPLACE", ContentType="text/x-b", Metadata={"b": "2"})
    assert r["CopyObjectResult"]["ETag"].strip('"') == md5_hex(data)
    head = s3.head_object(Bucket=bucket, Key="copy/plain.bin", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"') == md5_hex(data)
    assert head["ContentType"] == "text/x-b" and head["Metadata"] == {"b": "2"}
    assert head["ChecksumSHA256"] == sha256_b64(data)
    # To another key, asking for another algorithm: computed from the bytes.
    s3.copy_object(Bucket=bucket, Key="copy/other.bin", CopySource={"Bucket": bucket, "Key": "copy/plain.bin"},
                   ChecksumAlgorithm="CRC32")
    head = s3.head_object(Bucket=bucket, Key="copy/other.bin", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc32_b64(data) and head["ContentType"] == "text/x-b"
    # A multipart source: the copy is one piece (no PartsCount), its bytes exact.
    multipart(s3, bucket, "copy/mp.bin", [os.urandom(5 * MIB), b"end"])
    s3.copy_object(Bucket=bucket, Key="copy/mp-copy.bin", CopySource={"Bucket": bucket, "Key": "copy/mp.bin"})
    assert s3.get_object(Bucket=bucket, Key="copy/mp-copy.bin")["Body"].read() == \
        s3.get_object(Bucket=bucket, Key="copy/mp.bin")["Body"].read()
    assert "PartsCount" not in s3.head_object(Bucket=bucket, Key="copy/mp-copy.bin", PartNumber=1)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_expires_is_kept(gateway, bucket):
    s3 = gateway.client()
    when = datetime.datetime(2033, 12, 1, 16, 0, 0, tzinfo=datetime.timezone.utc)
    s3.put_object(Bucket=bucket, Key="exp/put", Body=b"x", Expires=when)
    assert s3.head_object(Bucket=bucket, Key="exp/put")["Expires"] == when
    assert s3.get_object(Bucket=bucket, Key="exp/put")["Expires"] == when
    multipart(s3, bucket, "exp/mp", [b"y"], Expires=when)
    assert s3.head_object(Bucket=bucket, Key="exp/mp")["Expires"] == when


def test_single_part_objects_are_their_own_part_one(gateway):
    s3 = gateway.client()
    s3.put_object(Bucket="default", Key="parts/single", Body=b"abc")
    got = s3.get_object(Bucket="default", Key="parts/single", PartNumber=1)
    assert got["Body"].read() == b"abc" and "PartsCount" not in got
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="default", Key="parts/single", PartNumber=2)
    assert code_of(e.value) == ("InvalidPartNumber", 416)


def test_the_reserved_metadata_name_is_never_taken_from_a_client(gateway):
    """`x-amz-meta-strataobject` is the gateway's own record of an object: a client's value there is dropped
    (another Strata agent in front of this gateway sends its record there), never stored: a forged parts record
    makes no part of the object."""
    s3 = gateway.client()
    s3.put_object(Bucket="default", Key="meta/reserved", Body=b"x", Metadata={"strataobject": "p=1*1", "a": "b"})
    head = s3.head_object(Bucket="default", Key="meta/reserved")
    assert head["Metadata"].get("strataobject") != "p=1*1" and head["Metadata"]["a"] == "b", head["Metadata"]
    got = s3.get_object(Bucket="default", Key="meta/reserved", PartNumber=1)
    assert got["Body"].read() == b"x" and "PartsCount" not in got


def test_an_agent_whose_origin_is_another_strata_gateway_writes_through_it(gateway, tmp_path):
    """Issue 44, finding 15: an agent in front of a Strata gateway (its backend is that gateway's bucket) takes
    PutObject from a default boto3 client (which sends a checksum, so the agent sends its own record of the
    object along) and multipart uploads; both gateways read the bytes back."""
    from conftest import ACCESS_KEY, SECRET_KEY, Gateway
    front = Gateway(gateway.endpoint, extra=f"""
[[backends]]
name = "upstream"
url = "s3://default/front"
[backends.options]
endpoint = "{gateway.endpoint}"
access_key_id = "{ACCESS_KEY}"
secret_access_key = "{SECRET_KEY}"
""")
    try:
        s3 = front.client()
        body = os.urandom(300_000)
        s3.put_object(Bucket="upstream", Key="a b+c.bin", Body=body)
        assert s3.get_object(Bucket="upstream", Key="a b+c.bin")["Body"].read() == body
        assert gateway.client().get_object(Bucket="default", Key="front/a b+c.bin")["Body"].read() == body
        parts = [os.urandom(5 * MIB), b"tail"]
        multipart(s3, "upstream", "mp.bin", parts)
        assert s3.get_object(Bucket="upstream", Key="mp.bin")["Body"].read() == b"".join(parts)
    finally:
        front.close()


@pytest.mark.parametrize("key", ["odd/dir/", "odd//double", "odd/./dot", "odd/trailing#1"])
def test_multipart_uploads_and_copies_of_odd_keys_on_the_s3_origin(gateway, origin, key):
    """Keys object_store cannot name go to S3 through Strata's own requests, multipart and copies included;
    the origin holds exactly the key."""
    from conftest import ORIGIN_KEY, ORIGIN_SECRET, client
    s3 = gateway.client()
    parts = [os.urandom(5 * MIB), b"last"]
    _, done, _ = multipart(s3, "origin", key, parts)
    whole = b"".join(parts)
    assert s3.get_object(Bucket="origin", Key=key)["Body"].read() == whole
    direct = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    assert direct.get_object(Bucket="gw-origin", Key=key)["Body"].read() == whole
    # A streamed PUT bigger than one request.
    big = os.urandom(9 * MIB)
    s3.put_object(Bucket="origin", Key=key, Body=big)
    assert direct.get_object(Bucket="gw-origin", Key=key)["Body"].read() == big
    # Copies to and from it, server-side.
    s3.copy_object(Bucket="origin", Key=key + "copy", CopySource={"Bucket": "origin", "Key": key})
    assert s3.get_object(Bucket="origin", Key=key + "copy")["Body"].read() == big
    r = s3.copy_object(Bucket="origin", Key=key, CopySource={"Bucket": "origin", "Key": key},
                       MetadataDirective="REPLACE", Metadata={"k": "v"})
    assert s3.head_object(Bucket="origin", Key=key)["Metadata"] == {"k": "v"}
    assert r["CopyObjectResult"]["ETag"]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_keys_with_a_line_break_are_refused_as_s3_does(gateway, bucket):
    s3 = gateway.client()
    for key in ["nl\nkey", "cr\rkey"]:
        for call in (lambda: s3.put_object(Bucket=bucket, Key=key, Body=b"x"),
                     lambda: s3.get_object(Bucket=bucket, Key=key),
                     lambda: s3.head_object(Bucket=bucket, Key=key)):
            with pytest.raises(ClientError) as e:
                call()
            assert code_of(e.value)[1] == 400


@pytest.mark.parametrize("bucket", BUCKETS)
def test_listings_name_the_owner_as_s3_does(gateway, bucket):
    s3 = gateway.client()
    s3.put_object(Bucket=bucket, Key="owner/x", Body=b"x")
    plain = s3.list_objects_v2(Bucket=bucket, Prefix="owner/")["Contents"][0]
    assert "Owner" not in plain
    fetched = s3.list_objects_v2(Bucket=bucket, Prefix="owner/", FetchOwner=True)["Contents"][0]
    assert len(fetched["Owner"]["ID"]) == 64 and fetched["Owner"]["DisplayName"]
    v1 = s3.list_objects(Bucket=bucket, Prefix="owner/")["Contents"][0]
    assert v1["Owner"] == fetched["Owner"]
    assert s3.list_buckets()["Owner"]["ID"] == fetched["Owner"]["ID"]


@pytest.mark.parametrize("bucket", BUCKETS)
def test_a_chunked_put_without_content_length_is_stored(gateway, bucket):
    """As S3: `Transfer-Encoding: chunked` without a length (curl -T -, a pipe) is a PUT like any other."""
    import subprocess
    from conftest import ACCESS_KEY, SECRET_KEY
    data = os.urandom(3 * MIB + 7)
    r = subprocess.run(["curl", "-sS", "-i", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                        "--user", f"{ACCESS_KEY}:{SECRET_KEY}", "-H", "Transfer-Encoding: chunked",
                        "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--data-binary", "@-",
                        # (curl's default form Content-Type would make moto, the origin, parse the body away)
                        "-H", "Content-Type: application/octet-stream",
                        f"{gateway.endpoint}/{bucket}/chunked/obj"], input=data, capture_output=True, check=True)
    import re
    # (curl asks `Expect: 100-continue` first) the final answer is 200
    assert re.findall(rb"^HTTP/1.1 (\d+)", r.stdout, re.M)[-1] == b"200", r.stdout[:400]
    got = gateway.client().get_object(Bucket=bucket, Key="chunked/obj")
    assert got["Body"].read() == data and got["ETag"].strip('"') == md5_hex(data)


def test_errors_s3s_answers_itself_carry_the_request_id(gateway):
    """An error answered before the gateway's own code runs (here a malformed x-amz-decoded-content-length)
    names its request in the body, like every other error."""
    import subprocess
    from conftest import ACCESS_KEY, SECRET_KEY
    r = subprocess.run(["curl", "-sS", "-i", "-X", "PUT", "--aws-sigv4", "aws:amz:us-east-1:s3",
                        "--user", f"{ACCESS_KEY}:{SECRET_KEY}", "-H", "x-amz-content-sha256: NOT-A-HASH",
                        "--data-binary", "hello", f"{gateway.endpoint}/default/rid/obj"],
                       capture_output=True, text=True, check=True)
    head, _, body = r.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.split()[1].startswith("4"), head
    rid = [line.split(":", 1)[1].strip() for line in head.splitlines() if line.lower().startswith("x-amz-request-id")]
    assert f"<RequestId>{rid[0]}</RequestId>" in body, body


def test_copies_of_a_version_are_refused_not_copied_from_the_current_one(gateway):
    s3 = gateway.client()
    s3.put_object(Bucket="default", Key="ver/src", Body=b"current")
    source = {"Bucket": "default", "Key": "ver/src", "VersionId": "v1"}
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket="default", Key="ver/dst", CopySource=source)
    assert code_of(e.value) == ("NotImplemented", 501)
    uid = s3.create_multipart_upload(Bucket="default", Key="ver/mp")["UploadId"]
    with pytest.raises(ClientError) as e:
        s3.upload_part_copy(Bucket="default", Key="ver/mp", UploadId=uid, PartNumber=1, CopySource=source)
    assert code_of(e.value) == ("NotImplemented", 501)
    s3.abort_multipart_upload(Bucket="default", Key="ver/mp", UploadId=uid)
    with pytest.raises(ClientError):
        s3.head_object(Bucket="default", Key="ver/dst")


def put_cut_short(gw, bucket, key, declared, sent):
    """A signed PutObject that declares `declared` bytes (payload unsigned, as streaming clients send) and
    sends `sent` of them before the connection is closed."""
    import socket
    import urllib.parse

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    from conftest import ACCESS_KEY, SECRET_KEY
    url = f"{gw.endpoint}/{bucket}/{key}"
    req = AWSRequest(method="PUT", url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD",
                                                     "Content-Length": str(declared)})
    botocore.auth.S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", "us-east-1").add_auth(req)
    u = urllib.parse.urlsplit(url)
    head = f"PUT {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\n" + \
        "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
    s = socket.create_connection((u.hostname, u.port))
    try:
        s.sendall(head.encode() + b"\r\n")
        left = sent
        while left:
            n = min(left, MIB)
            s.sendall(os.urandom(n))
            left -= n
        s.shutdown(socket.SHUT_WR)
        s.settimeout(30)
        try:
            answer = s.recv(65536)
        except OSError:
            answer = b""
        assert not answer.startswith(b"HTTP/1.1 2"), answer
    finally:
        s.close()


@pytest.mark.parametrize("bucket", BUCKETS)
def test_a_single_put_past_what_is_buffered_keeps_its_md5_etag_and_a_bad_one_stores_nothing(gateway, origin, bucket):
    """Issue 44, item 15: a single PutObject over the 8 MiB the gateway buffers went to an S3 origin as a
    multipart upload, so its ETag was S3's `<md5 of md5s>-2` form and rclone could not hash-check it. It is
    one PUT, streamed, with the MD5 ETag S3 gives a PutObject; a body that fails its check, or ends short,
    leaves nothing at the origin."""
    from conftest import ORIGIN_KEY, ORIGIN_SECRET, client
    s3 = gateway.client()
    direct = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    at_origin = {"default": None, "origin": "gw-origin"}[bucket]
    for size in (9 * MIB, 20 * MIB + 3):
        body = os.urandom(size)
        etag = f'"{md5_hex(body)}"'
        key = f"single/{size} ünï+%.bin"
        assert s3.put_object(Bucket=bucket, Key=key, Body=body)["ETag"] == etag
        assert s3.head_object(Bucket=bucket, Key=key)["ETag"] == etag
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == body
        if at_origin:
            assert direct.head_object(Bucket=at_origin, Key=key)["ETag"] == etag
    body = os.urandom(12 * MIB)
    bad = {"ContentMD5": b64(hashlib.md5(b"other").digest()), "ChecksumSHA256": sha256_b64(b"other")}
    for name, v in bad.items():
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket=bucket, Key=f"single/bad-{name}", Body=body, **{name: v})
        assert code_of(e.value)[1] == 400, name
    put_cut_short(gateway, bucket, "single/cut", 12 * MIB, 10 * MIB)
    for k in [f"single/bad-{n}" for n in bad] + ["single/cut"]:
        with pytest.raises(ClientError) as e:
            s3.head_object(Bucket=bucket, Key=k)
        assert code_of(e.value)[1] == 404, k
        if at_origin:
            with pytest.raises(ClientError) as e:
                direct.head_object(Bucket=at_origin, Key=k)
            assert code_of(e.value)[1] == 404, k
    if at_origin:
        assert "Uploads" not in direct.list_multipart_uploads(Bucket=at_origin, Prefix="single/")
