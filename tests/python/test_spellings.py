"""Ownership does not depend on how a location is spelled (issue 44, finding 1).

A created bucket under an S3 `[gateway] bucket_root` and a backend configured as `s3a://bucket/prefix` are each
reachable by another spelling: an ad-hoc `s3://` URL of the same store (same endpoint and bucket, through
`[s3_defaults]`). Every route that takes a location (read, list, warm-up, a claim, a checkpoint handoff's
`remote_url`) must decide on the store the URL reaches, not on its spelling: an ad-hoc URL that lands in a
configured backend or a created bucket is that backend or bucket (its owners decide), and one that would cover
them from above (the root prefix, the bucket around a configured prefix) is refused."""
import json
import os
import urllib.parse

import pytest

from conftest import ORIGIN_KEY, ORIGIN_SECRET, Gateway, client
from test_tenancy import _api, cli, cli_json, s3_for


@pytest.fixture(scope="module")
def spelled(origin):
    direct = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    direct.create_bucket(Bucket="spell")
    gw = Gateway(origin, gateway_extra=f"""bucket_root = "s3://gw-buckets/made"
[gateway.bucket_root_options]
endpoint = "{origin}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
""", extra=f"""
[[backends]]
name = "spelled"
url = "s3a://spell/pre"
[backends.options]
endpoint = "{origin}/"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"

[s3_defaults]
endpoint = "{origin}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
""")
    for t in ("team-a", "team-b"):
        cli(gw, "team", "create", t)
    cli(gw, "prefix", "own", "spelled", "team-a/", "team-a")
    toks = {
        "a": cli_json(gw, "token", "create", "--name", "sp-a", "--team", "team-a")["token"],
        "b": cli_json(gw, "token", "create", "--name", "sp-b", "--team", "team-b")["token"],
        "b_reader": cli_json(gw, "token", "create", "--name", "sp-br", "--team", "team-b",
                             "--role", "reader")["token"],
    }
    s3a = s3_for(gw, cli_json(gw, "token", "create", "--name", "sp-a-s3", "--team", "team-a", "--s3"))
    s3a.create_bucket(Bucket="a-private")
    s3a.put_object(Bucket="a-private", Key="secret.txt", Body=b"team a's bucket")
    direct.put_object(Bucket="spell", Key="pre/team-a/secret.txt", Body=b"team a's prefix")
    yield gw, toks, direct
    gw.close()


def q(loc):
    return urllib.parse.quote(loc, safe="")


# Every spelling of team A's data another team might try, and the answer: 403 where the URL reaches an owned
# store (the owner's rule decides), 400 where it would cover configured stores from above.
FORBIDDEN = [
    "s3://gw-buckets/made/a-private/secret.txt",
    "s3a://gw-buckets/made/a-private/secret.txt",
    "s3://spell/pre/team-a/secret.txt",
    "s3a://spell/pre/team-a/secret.txt",
    "s3://SPELL/pre/team-a/secret.txt",
]
COVERING = ["s3://gw-buckets/made/", "s3://gw-buckets/made", "s3://gw-buckets/", "s3://spell/", "s3://spell/pr"]


@pytest.mark.parametrize("loc", FORBIDDEN)
def test_another_teams_data_is_closed_whatever_the_spelling(spelled, loc):
    gw, toks, _ = spelled
    for who in ("b", "b_reader"):
        s, body = _api(gw, "GET", f"/v1/read?location={q(loc)}", toks[who])
        assert s == 403 and b"team a's" not in body, (who, loc, s, body)
        prefix = loc.rsplit("/", 1)[0] + "/"
        s, body = _api(gw, "GET", f"/v1/list?location={q(prefix)}", toks[who])
        assert s == 403 and b"secret" not in body, (who, prefix, s, body)
        s, body = _api(gw, "POST", "/v1/cache/warm", toks[who], {"location": prefix})
        assert s == 403 and b"secret" not in body, (who, prefix, s, body)
    # the owner reads it by the same spelling: the URL is the owned store itself
    s, body = _api(gw, "GET", f"/v1/read?location={q(loc)}", toks["a"])
    assert s == 200 and body.startswith(b"team a's"), (loc, s, body)


@pytest.mark.parametrize("loc", COVERING)
def test_a_url_covering_configured_stores_is_refused(spelled, loc):
    gw, toks, _ = spelled
    for who in ("b", "a"):
        s, body = _api(gw, "GET", f"/v1/list?location={q(loc)}", toks[who])
        assert s in (400, 403) and b"secret" not in body, (who, loc, s, body)
        s, body = _api(gw, "POST", "/v1/cache/warm", toks[who], {"location": loc})
        assert s in (400, 403) and b"secret" not in body, (who, loc, s, body)


def test_a_claim_and_a_handoff_cannot_reach_another_teams_bucket_by_url(spelled, tmp_path):
    gw, toks, direct = spelled
    for loc in ("s3://gw-buckets/made/a-private/", "s3://spell/pre/team-a/"):
        s, body = _api(gw, "POST", "/v1/claims", toks["b"], {
            "version": 1, "job": "steal", "team": "team-b",
            "datasets": [{"name": "train", "location": loc}]})
        assert s == 403, (loc, s, body)
    # a handoff whose remote_url is team A's bucket, spelled as a URL, from a team B member
    local = os.path.join(gw.mount, "b-ckpt")
    os.makedirs(os.path.join(local, "run-b"), exist_ok=True)
    hand = {"run_id": "run-b", "step": 1, "rank": 0, "world_size": 1, "upload": True, "local_dir": local,
            "remote_url": "s3://gw-buckets/made/a-private", "peers": [], "self_peer": None, "replicas": 0,
            "keep_local": 0, "keep_remote": 0, "keep_every": None, "commit_timeout_ms": 2000}
    s, body = _api(gw, "POST", "/v1/ckpt/handoff", toks["b"], hand)
    assert s == 403, (s, body)
    keys = [o["Key"] for o in direct.list_objects_v2(Bucket="gw-buckets", Prefix="made/a-private/").get(
        "Contents", [])]
    assert keys == ["made/a-private/secret.txt"], keys


def test_a_url_into_a_configured_backend_is_that_backend(spelled):
    """An ad-hoc URL inside a configured backend is the backend: its listing names the same objects, and
    an unowned key reads for anyone, as by the backend's name."""
    gw, toks, direct = spelled
    direct.put_object(Bucket="spell", Key="pre/open/k.txt", Body=b"open data")
    for loc in ("spelled/open/k.txt", "s3://spell/pre/open/k.txt", "s3a://spell/pre/open/k.txt"):
        s, body = _api(gw, "GET", f"/v1/read?location={q(loc)}", toks["b"])
        assert (s, body) == (200, b"open data"), (loc, s, body)
    s, body = _api(gw, "GET", f"/v1/list?location={q('s3://spell/pre/open/')}", toks["b"])
    assert s == 200 and [o["name"] for o in json.loads(body)["objects"]] == ["k.txt"], body


@pytest.mark.parametrize("root,backend", [
    ("s3://gw-origin/made", "s3://gw-origin"),
    ("s3a://GW-ORIGIN/made/", "s3://gw-origin/made/x"),
    ("file://{mount}/buckets", "file://{mount}"),
    ("file://{data}", "file://{mount}"),
])
def test_a_bucket_root_overlapping_a_backend_is_refused_at_start(origin, root, backend, tmp_path):
    """A bucket root inside a configured backend (or around one) would make created buckets readable by that
    backend's name (`origin/made/<bucket>/...`), outside their owners' rule: the agent refuses to start."""
    import subprocess
    from conftest import STRATA
    data = tmp_path / "data"
    mount = data / "objects"
    cfg = tmp_path / "strata.toml"
    opts = f'endpoint = "{origin}"\naccess_key_id = "{ORIGIN_KEY}"\nsecret_access_key = "{ORIGIN_SECRET}"\n'
    cfg.write_text(f"""[gateway]
bucket_root = "{root.format(mount=mount, data=data)}"
[gateway.bucket_root_options]
{opts}
[[backends]]
name = "origin"
url = "{backend.format(mount=mount, data=data)}"
[backends.options]
{opts}""")
    r = subprocess.run([STRATA, "serve", "--config", str(cfg), "--data-dir", str(data), "--api-listen",
                        "127.0.0.1:0", "--s3-listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "overlaps backend" in r.stderr, (r.returncode, r.stderr[-2000:])
