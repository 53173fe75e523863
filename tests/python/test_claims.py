"""Claims end to end: `strata serve` in front of a real S3 server (moto), driven by the `strata claim` CLI and
the control API as a job (and a hostile neighbour) would.

Covered: a claim staged to `ready` with counts equal to its snapshot (and the job's reads then served from the
cache, byte-exact); validation errors naming the field (CLI and API); quota refused before anything is staged;
an empty or missing dataset refused; a claim larger than the cache failing with a reason instead of saying
ready; two claims of one dataset sharing its blocks; pins and scratch held for the claim's life and freed by a
release that is idempotent; TTL expiry; another team's principals seeing nothing and a reader unable to
release; a claim reaching for another team's owned data (to read or to checkpoint into) refused; staging resumed by an agent restarted mid-way.
"""
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import ADMIN_TOKEN, ORIGIN_KEY, ORIGIN_SECRET, STRATA, client, poll

MIB = 1024 * 1024
BUCKET = "claims-origin"


class Agent:
    """One `strata serve` with an S3 backend `origin` on moto, a small cache, and the test's admin token."""

    def __init__(self, origin, ram="16MiB", disk="256MiB", extra="", cgroup=None):
        """`extra`: more configuration (TOML); `cgroup`: a cgroup v2 directory every start of the agent is put
        in (as a container's processes are)."""
        self.cgroup = cgroup
        self.dir = tempfile.mkdtemp(prefix="strata-claims-")
        self.data = os.path.join(self.dir, "data")
        self.cfg = os.path.join(self.dir, "strata.toml")
        with open(self.cfg, "w") as f:
            f.write(f"""
[cache]
block_size = "1MiB"
ram_capacity = "{ram}"
disk_capacity = "{disk}"

[retry]
max_retries = 1
initial_backoff = 10
max_backoff = 50

[[backends]]
name = "origin"
url = "s3://{BUCKET}"
[backends.options]
endpoint = "{origin}"
access_key_id = "{ORIGIN_KEY}"
secret_access_key = "{ORIGIN_SECRET}"
{extra}
""")
        self.proc = None
        self.start()

    def start(self, listen="127.0.0.1:0"):
        """Start (again); `listen`: the API's address (a restarted agent keeps its own: its mounts read there)."""
        addr = os.path.join(self.data, "api.addr")
        if os.path.exists(addr):
            os.remove(addr)
        self.proc = subprocess.Popen(
            [STRATA, "serve", "--config", self.cfg, "--data-dir", self.data, "--api-listen", listen],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, STRATA_LOG="warn"))
        if self.cgroup is not None:
            with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(self.proc.pid))
        deadline = time.time() + 30
        while not (os.path.exists(addr) and open(addr).read().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError("strata serve exited: " + self.proc.stderr.read().decode())
            assert time.time() < deadline, "strata serve did not start"
            time.sleep(0.05)
        self.api = open(addr).read().strip()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, method, path, body=None, token=ADMIN_TOKEN):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw and r.headers.get_content_type() == "application/json" else raw)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw

    def ok(self, method, path, body=None, token=ADMIN_TOKEN):
        s, v = self.call(method, path, body, token)
        assert s == 200, f"{method} {path}: {s} {v}"
        return v

    def cli(self, *args, check=True, input=None):
        r = subprocess.run([STRATA, *args, "--api", self.api], capture_output=True, text=True, input=input,
                           env=dict(os.environ, STRATA_TOKEN=ADMIN_TOKEN), timeout=300)
        if check:
            assert r.returncode == 0, f"strata {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    def cache(self):
        return self.ok("GET", "/v1/cache")

    def wait_settled(self, cid, timeout=120):
        deadline = time.time() + timeout
        while True:
            c = self.ok("GET", f"/v1/claims/{cid}")
            if c["state"] in ("ready", "failed", "released"):
                return c
            assert time.time() < deadline, f"claim still {c['state']}: {c['progress']}"
            time.sleep(0.2)

    def token(self, team, role, name):
        """A bearer token of a new principal with `role` in `team` (created if needed)."""
        self.call("POST", "/v1/teams", {"name": team})
        v = self.ok("POST", "/v1/tokens", {"name": name, "kind": "token", "team": team, "role": role})
        return v["token"]


@pytest.fixture(scope="module")
def s3(origin):
    c = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    try:
        c.create_bucket(Bucket=BUCKET)
    except c.exceptions.BucketAlreadyOwnedByYou:
        pass
    return c


@pytest.fixture()
def agent(origin, s3):
    a = Agent(origin)
    a.call("POST", "/v1/teams", {"name": "vision"})
    yield a
    a.close()


def put_dataset(s3, prefix, sizes):
    """Objects of the given sizes under `prefix` (ugly names included); returns {key: sha256}."""
    names = ["plain.bin", "with space.bin", "plus+sign.bin", "per%cent.bin", "ünï/日本.bin", "deep/er/x.bin"]
    out = {}
    for i, size in enumerate(sizes):
        key = f"{prefix}{i:03d}-{names[i % len(names)]}"
        body = hashlib.sha256(f"{key}".encode()).digest() * (size // 32) + b"x" * (size % 32)
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        out[key] = hashlib.sha256(body).hexdigest()
    return out


def write_claim(tmp_path, text, name="claim.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def claim_yaml(job, location, mode="stage", extra=""):
    return f"""
version: 1
job: {job}
team: vision
datasets:
  - name: train
    location: {location}
    mode: {mode}
{extra}"""


def test_a_claim_is_ready_only_when_every_block_is_cached_and_the_job_then_reads_from_the_cache(agent, s3, tmp_path):
    objs = put_dataset(s3, "ds-ready/", [3 * MIB + 7, MIB, 17, 0, 2 * MIB, 5 * MIB + 1])
    f = write_claim(tmp_path, claim_yaml("job-ready", "origin/ds-ready/"))
    r = agent.cli("claim", "submit", f, "--wait")
    cid = r.stdout.strip().splitlines()[-1]
    assert "ready" in r.stderr, r.stderr
    c = agent.ok("GET", f"/v1/claims/{cid}")
    p = c["progress"]
    assert c["state"] == "ready" and c["ready_at"] is not None
    assert p["objects_total"] == len(objs) == p["objects_done"]
    blocks = sum(max(1, -(-s // MIB)) if s else 0 for s in [3 * MIB + 7, MIB, 17, 0, 2 * MIB, 5 * MIB + 1])
    assert p["blocks_total"] == blocks == p["blocks_held"], p
    assert p["bytes_done"] == p["bytes_total"] == sum([3 * MIB + 7, MIB, 17, 0, 2 * MIB, 5 * MIB + 1])
    assert c["datasets"][0]["objects"] == len(objs)
    assert c["env"]["STRATA_DATASET_TRAIN"] == "origin/ds-ready/"
    assert c["env"]["STRATA_CLAIM"] == cid and c["env"]["STRATA_JOB"] == "job-ready"
    assert c["env"]["STRATA_AGENT"] == agent.api
    assert c["usage"]["staged_bytes"] == p["bytes_total"]
    # the job's reads: every byte right, none from the origin
    before = agent.cache()
    for key, digest in objs.items():
        s, body = agent.call("GET", "/v1/read?location=" + urllib.request.quote(f"origin/{key}", safe=""))
        assert s == 200, (key, s, body)
        assert hashlib.sha256(body if isinstance(body, bytes) else json.dumps(body).encode()).hexdigest() == digest, key
    after = agent.cache()
    assert after["fill_requests"] == before["fill_requests"], "a staged dataset is read without the origin"
    # `strata claim env` gives a shell what the job needs
    env = agent.cli("claim", "env", cid).stdout
    assert f"export STRATA_CLAIM='{cid}'" in env and "export STRATA_DATASET_TRAIN='origin/ds-ready/'" in env
    # release: idempotent, and never deletes the dataset
    r1 = agent.cli("claim", "release", cid, "--reason", "job ended")
    assert f"released {cid}" in r1.stdout
    r2 = agent.cli("claim", "release", cid)
    assert "already released (job ended)" in r2.stdout
    assert agent.ok("GET", f"/v1/claims/{cid}")["state"] == "released"
    assert len(s3.list_objects_v2(Bucket=BUCKET, Prefix="ds-ready/")["Contents"]) == len(objs)


def test_validation_names_the_field_on_the_cli_and_the_api(agent, tmp_path):
    bad = claim_yaml("job-bad", "origin/x/", mode="stge")
    r = agent.cli("claim", "validate", write_claim(tmp_path, bad), check=False)
    assert r.returncode != 0 and "datasets[0].mode" in r.stderr and "stge" in r.stderr, r.stderr
    r = agent.cli("claim", "validate", write_claim(tmp_path, claim_yaml("job ok", "origin/x/")), check=False)
    assert r.returncode != 0 and "job:" in r.stderr, r.stderr
    r = agent.cli("claim", "validate", "-", input=claim_yaml("job-ok", "origin/x/"))
    assert "valid: job job-ok of team vision, 1 dataset(s)" in r.stdout
    for body, field in [
        ({"version": 1, "job": "j", "team": "vision", "datasets": [{"name": "a", "location": "origin/x/",
                                                                    "mode": "stge"}]}, "datasets[0].mode"),
        ({"version": 1, "job": "j", "team": "vision", "datasets": [{"name": "A", "location": "origin/x/"}]},
         "datasets[0].name"),
        ({"version": 1, "job": "j", "team": "vision", "scratch": {"size": "0", "ttl_secs": 10}}, "scratch.size"),
        ({"version": 1, "job": "j", "team": "vision", "surprise": 1}, "surprise"),
        ({"version": 2, "job": "j", "team": "vision", "scratch": {"size": 1, "ttl_secs": 1}}, "version"),
    ]:
        for path in ("/v1/claims/validate", "/v1/claims"):
            s, v = agent.call("POST", path, body)
            assert s == 400 and v["error"] == "invalid_input" and field in v["message"], (path, body, s, v)
    s, v = agent.call("POST", "/v1/claims/validate", {"version": 1, "job": "j", "team": "vision",
                                                      "scratch": {"size": "1GiB", "ttl_secs": 60}})
    assert s == 200 and v["valid"] is True
    schema = agent.ok("GET", "/v1/claims/schema", token=None)
    assert schema["properties"]["datasets"]["items"]["properties"]["mode"]["enum"] == ["stage", "pin", "stream"]
    assert agent.ok("GET", "/v1/claims") == [], "nothing was admitted"


def test_quota_is_refused_before_anything_is_staged(agent, s3):
    put_dataset(s3, "ds-quota/", [2 * MIB, 2 * MIB])
    agent.ok("PUT", "/v1/quotas/vision/scratch", {"hard_bytes": 10 * MIB})
    agent.ok("PUT", "/v1/quotas/vision/cache", {"hard_bytes": MIB})
    before = agent.cache()["fill_requests"]
    s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-q1", "team": "vision",
                                             "datasets": [{"name": "train", "location": "origin/ds-quota/"}],
                                             "scratch": {"size": "1GiB", "ttl_secs": 600}})
    assert s == 429 and v["error"] == "resource_exhausted" and "scratch.size" in v["message"], (s, v)
    s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-q2", "team": "vision",
                                             "datasets": [{"name": "train", "location": "origin/ds-quota/",
                                                           "mode": "pin"}]})
    assert s == 429 and "datasets[0] (pin)" in v["message"], (s, v)
    time.sleep(0.5)
    assert agent.cache()["fill_requests"] == before, "nothing staged for a refused claim"
    assert agent.ok("GET", "/v1/claims") == []
    done = agent.ok("GET", "/v1/claims?released=true")
    assert {c["job"] for c in done} == {"job-q1", "job-q2"}
    assert all(c["reason"].startswith("not admitted:") for c in done), done
    q = {r["scope"]: r for r in agent.ok("GET", "/v1/quotas/vision")}
    assert q["scratch"]["used_bytes"] == 0 and q["scratch"]["reserved_bytes"] == 0, q["scratch"]
    assert q["cache"]["used_bytes"] == 0 and q["cache"]["reserved_bytes"] == 0, q["cache"]
    assert agent.ok("GET", "/v1/protections") == [], "no protection outlives a refused claim"
    # a second live claim of one job is refused too
    ok = {"version": 1, "job": "job-q3", "team": "vision", "datasets": [{"name": "t", "location": "origin/ds-quota/"}]}
    agent.ok("POST", "/v1/claims", ok)
    s, v = agent.call("POST", "/v1/claims", ok)
    assert s == 409 and "already has a live claim for job job-q3" in v["message"], (s, v)


def test_missing_and_empty_datasets_are_refused_with_the_field(agent, s3):
    for loc, want in [("origin/no-such-prefix/", "no objects under"), ("origin/no-such-object.bin", "no object"),
                      ("nosuchbackend/x/", "datasets[0].location")]:
        s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-m", "team": "vision",
                                                 "datasets": [{"name": "train", "location": loc}]})
        assert s in (400, 404) and "datasets[0].location" in v["message"] and want in v["message"], (loc, s, v)


def test_a_claim_larger_than_the_cache_fails_with_a_reason_instead_of_saying_ready(origin, s3):
    put_dataset(s3, "ds-big/", [3 * MIB] * 6)
    a = Agent(origin, ram="2MiB", disk="8MiB")
    try:
        a.call("POST", "/v1/teams", {"name": "vision"})
        c = a.ok("POST", "/v1/claims", {"version": 1, "job": "job-big", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-big/"}]})
        c = a.wait_settled(c["id"])
        assert c["state"] == "failed", c
        p = c["progress"]
        assert p["blocks_held"] < p["blocks_total"] == 18, p
        assert "blocks not in the cache after staging" in c["reason"], c["reason"]
        r = a.cli("claim", "wait", c["id"], check=False)
        assert r.returncode == 1 and "failed" in r.stderr, r.stderr
    finally:
        a.close()


def test_two_claims_of_one_dataset_share_its_blocks(agent, s3):
    put_dataset(s3, "ds-shared/", [2 * MIB, 3 * MIB])
    body = lambda job: {"version": 1, "job": job, "team": "vision",
                        "datasets": [{"name": "train", "location": "origin/ds-shared/"}]}
    a = agent.wait_settled(agent.ok("POST", "/v1/claims", body("job-s1"))["id"])
    fills = agent.cache()["fill_requests"]
    b = agent.wait_settled(agent.ok("POST", "/v1/claims", body("job-s2"))["id"])
    assert a["state"] == b["state"] == "ready"
    assert agent.cache()["fill_requests"] == fills, "the second claim read nothing from the origin"
    assert b["usage"]["staged_bytes"] == 0 and b["usage"]["staged_cached_bytes"] == 5 * MIB, b["usage"]


def test_pins_and_scratch_are_held_for_the_claim_and_freed_by_release(agent, s3):
    put_dataset(s3, "ds-pin/", [2 * MIB, MIB])
    c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-p", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-pin/", "mode": "pin"}],
                                        "scratch": {"size": "64MiB", "ttl_secs": 3600},
                                        "checkpoint": {"location": "origin/ckpt/job-p/", "keep_last": 2}})
    c = agent.wait_settled(c["id"])
    assert c["state"] == "ready", c
    assert any(p["prefix"] == "ds-pin/" for p in agent.cache()["pins"]), agent.cache()["pins"]
    q = {r["scope"]: r for r in agent.ok("GET", "/v1/quotas/vision")}
    assert q["cache"]["used_bytes"] == 3 * MIB and q["scratch"]["used_bytes"] == 64 * MIB, q
    prots = agent.ok("GET", "/v1/protections")
    assert [(p["kind"], p["prefix"], p["job"]) for p in prots] == [("claim", "ds-pin/", c["id"])], prots
    scratch = c["env"]["STRATA_SCRATCH"]
    assert os.path.isdir(scratch) and c["env"]["STRATA_CKPT"] == "origin/ckpt/job-p/"
    assert c["env"]["STRATA_CKPT_KEEP_LAST"] == "2"
    with open(os.path.join(scratch, "tmp.bin"), "wb") as f:
        f.write(b"s" * 300_000)
    r = agent.ok("POST", f"/v1/claims/{c['id']}/release", {"reason": "done"})
    assert r["released_now"] is True and r["state"] == "released"
    assert r["usage"]["scratch_peak_bytes"] >= 300_000, r["usage"]
    assert not os.path.exists(scratch), "scratch goes to the trash"
    assert os.path.exists(os.path.join(agent.data, "scratch-trash", os.path.basename(scratch), "tmp.bin"))
    assert not any(p["prefix"] == "ds-pin/" for p in agent.cache()["pins"])
    q = {r["scope"]: r for r in agent.ok("GET", "/v1/quotas/vision")}
    assert q["cache"]["used_bytes"] == 0 and q["scratch"]["used_bytes"] == 0, q
    assert agent.ok("GET", "/v1/protections") == []
    again = agent.ok("POST", f"/v1/claims/{c['id']}/release", {})
    assert again["released_now"] is False and again["reason"] == "done"
    q2 = {r["scope"]: r for r in agent.ok("GET", "/v1/quotas/vision")}
    assert q2 == q, "a second release changes nothing"


def test_a_pin_another_claim_holds_stays_pinned(agent, s3):
    put_dataset(s3, "ds-pin2/", [MIB])
    body = lambda job: {"version": 1, "job": job, "team": "vision",
                        "datasets": [{"name": "train", "location": "origin/ds-pin2/", "mode": "pin"}]}
    a = agent.wait_settled(agent.ok("POST", "/v1/claims", body("job-pa"))["id"])
    b = agent.wait_settled(agent.ok("POST", "/v1/claims", body("job-pb"))["id"])
    agent.ok("POST", f"/v1/claims/{a['id']}/release", {})
    assert any(p["prefix"] == "ds-pin2/" for p in agent.cache()["pins"]), "still pinned for job-pb"
    agent.ok("POST", f"/v1/claims/{b['id']}/release", {})
    assert not any(p["prefix"] == "ds-pin2/" for p in agent.cache()["pins"])


def test_a_claim_without_heartbeats_is_released_after_its_ttl(agent, s3):
    put_dataset(s3, "ds-ttl/", [MIB])
    c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-ttl", "team": "vision", "ttl_secs": 10,
                                        "datasets": [{"name": "train", "location": "origin/ds-ttl/"}],
                                        "scratch": {"size": "1MiB", "ttl_secs": 3600}})
    h = agent.wait_settled(c["id"])
    assert h["state"] == "ready"
    # Timed from the agent's own stamps (whole seconds), not from sleeps a loaded machine stretches: the
    # heartbeat renews the stamp, and the release comes a TTL after the renewed one, not after the first.
    time.sleep(max(0.0, h["heartbeat_at"] + 5 - time.time()))
    hb = agent.cli("claim", "heartbeat", c["id"])
    assert "ready" in hb.stdout
    renewed = agent.ok("GET", f"/v1/claims/{c['id']}")
    assert renewed["state"] == "ready" and renewed["heartbeat_at"] >= h["heartbeat_at"] + 5, (h, renewed)
    deadline = time.time() + 40
    while agent.ok("GET", f"/v1/claims/{c['id']}")["state"] != "released":
        assert time.time() < deadline, "not released after its TTL"
        time.sleep(0.5)
    r = agent.ok("GET", f"/v1/claims/{c['id']}")
    assert r["released_at"] >= renewed["heartbeat_at"] + 10, ("released on the first stamp's TTL", h, r)
    assert "no heartbeat for 10 s" in r["reason"], r
    q = {x["scope"]: x for x in agent.ok("GET", "/v1/quotas/vision")}
    assert q["scratch"]["used_bytes"] == 0
    s, v = agent.call("POST", f"/v1/claims/{c['id']}/heartbeat", {})
    assert s == 412 and "released" in v["message"], (s, v)


def test_other_teams_see_nothing_and_readers_cannot_release(agent, s3):
    put_dataset(s3, "ds-tenancy/", [MIB])
    c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-t", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-tenancy/"}]})
    other = agent.token("audio", "team_admin", "audio-admin")
    reader = agent.token("vision", "reader", "vision-reader")
    member = agent.token("vision", "member", "vision-member")
    for method, path, body in [("GET", f"/v1/claims/{c['id']}", None),
                               ("POST", f"/v1/claims/{c['id']}/release", {}),
                               ("POST", f"/v1/claims/{c['id']}/heartbeat", {})]:
        s, v = agent.call(method, path, body, token=other)
        assert s == 404, (method, path, s, v)
        s, v = agent.call(method, path, body, token="forged-token")
        assert s == 401, (method, path, s, v)
    assert agent.ok("GET", "/v1/claims", token=other) == []
    s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-t2", "team": "vision",
                                             "datasets": [{"name": "train", "location": "origin/ds-tenancy/"}]},
                      token=other)
    assert s == 403, (s, v)
    assert agent.ok("GET", f"/v1/claims/{c['id']}", token=reader)["job"] == "job-t"
    s, v = agent.call("POST", f"/v1/claims/{c['id']}/release", {}, token=reader)
    assert s == 403, (s, v)
    assert agent.ok("POST", f"/v1/claims/{c['id']}/release", {}, token=member)["released_now"] is True


def test_staging_resumes_after_the_agent_is_killed(origin, s3):
    put_dataset(s3, "ds-resume/", [4 * MIB] * 8)
    a = Agent(origin)
    try:
        a.call("POST", "/v1/teams", {"name": "vision"})
        c = a.ok("POST", "/v1/claims", {"version": 1, "job": "job-r", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-resume/"}]})
        deadline = time.time() + 60
        while a.cache()["disk"]["blocks"] < 3:
            assert time.time() < deadline
            time.sleep(0.02)
        a.kill()
        a.start()
        c = a.wait_settled(c["id"])
        assert c["state"] == "ready", c
        assert c["progress"]["blocks_held"] == c["progress"]["blocks_total"] == 32
    finally:
        a.close()


def test_a_claim_cannot_reach_another_teams_data(agent, s3):
    put_dataset(s3, "audio-owned/", [MIB])
    agent.call("POST", "/v1/teams", {"name": "audio"})
    agent.ok("PUT", "/v1/prefixes", {"backend": "origin", "prefix": "audio-owned/", "team": "audio"})
    member = agent.token("vision", "member", "vision-member-2")
    for ds, field in [({"name": "train", "location": "origin/audio-owned/"}, "datasets[0].location"),
                      ({"name": "train", "location": "origin/audio-owned/x.bin"}, "datasets[0].location")]:
        s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-x", "team": "vision", "datasets": [ds]},
                          token=member)
        assert s in (403, 404) and field in v["message"], (ds, s, v)
    # nor write checkpoints there
    put_dataset(s3, "vision-ok/", [MIB])
    s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-x", "team": "vision",
                                             "datasets": [{"name": "train", "location": "origin/vision-ok/"}],
                                             "checkpoint": {"location": "origin/audio-owned/ckpt/"}}, token=member)
    assert s == 403 and "checkpoint.location" in v["message"], (s, v)
    # A claim reaches only what its team may: a member of both teams, or an admin (the Kubernetes operator
    # submits every namespace's claims as one), submitting for vision cannot reach audio's data through it.
    both = agent.ok("POST", "/v1/tokens", {"name": "both-teams", "kind": "token", "team": "vision", "role": "member"})
    agent.ok("PUT", f"/v1/teams/audio/members/{both['principal']['id']}", {"role": "member"})
    for who, tok in [("member of both", both["token"]), ("admin", ADMIN_TOKEN)]:
        s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": "job-y", "team": "vision",
                                                 "datasets": [{"name": "train", "location": "origin/audio-owned/"}]},
                          token=tok)
        assert s in (403, 404) and "datasets[0].location" in v["message"], (who, s, v)
    assert agent.ok("GET", "/v1/claims") == [], "nothing admitted"


def _fuse_or_skip():
    ok = os.path.exists("/dev/fuse") and shutil.which("fusermount3") and os.geteuid() == 0
    if not ok:
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            pytest.fail("STRATA_REQUIRE_FUSE=1 but /dev/fuse, fusermount3 or root is missing")
        pytest.skip("claim mounts need /dev/fuse and root")


def _ensure_group_member(group, user):
    """A Unix group named like the team, and a user in it (the job's user)."""
    if subprocess.run(["getent", "group", group], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", group], check=True)
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "-N", "-G", group, user], check=True)


def _ensure_outsider(user):
    """A user of the node in no team's group."""
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "-N", user], check=True)


def _mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def _read_as(user, path):
    return subprocess.run(["runuser", "-u", user, "--", "cat", path], capture_output=True)


def test_a_claims_mount_serves_its_admitted_versions_to_its_team_only_and_goes_at_release(agent, s3):
    _fuse_or_skip()
    _ensure_group_member("vision", "strata-vision")
    objs = put_dataset(s3, "ds-mount/", [3 * MIB + 5, 17, 0, MIB, 2 * MIB, 100])
    base = tempfile.mkdtemp(prefix="strata-claim-mnt-")
    os.chmod(base, 0o755)
    mnt = os.path.join(base, "job", "train")
    try:
        c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-mnt", "team": "vision",
                                            "datasets": [{"name": "train", "location": "origin/ds-mount/",
                                                          "mount": mnt}]})
        c = agent.wait_settled(c["id"])
        assert c["state"] == "ready", c["reason"]
        assert c["env"]["STRATA_MOUNT_TRAIN"] == mnt
        assert _mounted(mnt), "Ready means mounted"
        # every admitted version, byte-exact, through the mount; the last one is left unread for later
        keys = sorted(objs)
        for key in keys[:-1]:
            path = os.path.join(mnt, key[len("ds-mount/"):])
            with open(path, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == objs[key], key
        st = os.stat(mnt)
        assert st.st_mode & 0o777 == 0o550 and st.st_uid == 0
        # the team's users read it; other users of the node do not
        first = os.path.join(mnt, keys[0][len("ds-mount/"):])
        r = _read_as("strata-vision", first)
        assert r.returncode == 0 and hashlib.sha256(r.stdout).hexdigest() == objs[keys[0]], r.stderr
        _ensure_outsider("strata-outsider")
        r = _read_as("strata-outsider", first)
        assert r.returncode != 0 and b"Permission denied" in r.stderr, r
        # the mount serves the versions the claim admitted: an object changed since reads as ESTALE, never as
        # other bytes
        s3.put_object(Bucket=BUCKET, Key=keys[-1], Body=b"changed after admission")
        with pytest.raises(OSError) as e:
            with open(os.path.join(mnt, keys[-1][len("ds-mount/"):]), "rb") as f:
                f.read()
        assert e.value.errno == 116, e.value  # ESTALE
        # release unmounts, and the dataset stays
        agent.ok("POST", f"/v1/claims/{c['id']}/release", {"reason": "job ended"})
        deadline = time.time() + 10
        while _mounted(mnt):
            assert time.time() < deadline, "still mounted after release"
            time.sleep(0.1)
        assert os.listdir(mnt) == []
        assert len(s3.list_objects_v2(Bucket=BUCKET, Prefix="ds-mount/")["Contents"]) == len(objs)
        # a second release changes nothing
        assert agent.ok("POST", f"/v1/claims/{c['id']}/release", {})["released_now"] is False
    finally:
        if _mounted(mnt):
            subprocess.run(["umount", "-l", mnt])
        shutil.rmtree(base, ignore_errors=True)


UNIFIED = "/sys/fs/cgroup/unified"


def _cgroup_or_skip():
    """A cgroup v2 of the test's own (what a container runtime gives a container), removed after."""
    root = UNIFIED if os.path.exists(os.path.join(UNIFIED, "cgroup.procs")) else "/sys/fs/cgroup"
    path = os.path.join(root, f"strata-agent-{os.getpid()}-{time.time_ns()}")
    try:
        os.mkdir(path)
    except OSError as e:
        if os.environ.get("STRATA_REQUIRE_FUSE") == "1":
            pytest.fail(f"no cgroup v2 to put an agent in: {e}")
        pytest.skip(f"no cgroup v2 to put an agent in: {e}")
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        os.rmdir(path)
        pytest.skip("this kernel's cgroup v2 has no cgroup.kill")
    return path


def _kill_cgroup(path):
    """What a container's restart does to its processes: every one of them killed at once."""
    with open(os.path.join(path, "cgroup.kill"), "w") as f:
        f.write("1")
    deadline = time.time() + 10
    while open(os.path.join(path, "cgroup.procs")).read().strip():
        assert time.time() < deadline, "processes left in the cgroup"
        time.sleep(0.05)


@pytest.mark.parametrize("through_mounter", [True, False], ids=["mounter", "agent-alone"])
def test_a_claims_mount_made_by_the_mounter_outlives_the_agents_cgroup(origin, s3, tmp_path, through_mounter):
    # The agent in a cgroup of its own, as in a container; its "restart" kills every process of the cgroup.
    # With `[claims] mounter`, the mount's holder is the mounter's (another container on Kubernetes): the mount
    # stays, a read waits for the agent and gets every byte. Without (the agent alone), the holder dies with the
    # agent's cgroup and the mount with it: that case shows what the mounter is for.
    _fuse_or_skip()
    _ensure_group_member("vision", "strata-vision")
    cg = _cgroup_or_skip()
    sock = str(tmp_path / "run" / "mounter.sock")
    mounter = None
    if through_mounter:
        mounter = subprocess.Popen([STRATA, "mounter", "--socket", sock], stdout=subprocess.DEVNULL,
                                   stderr=open(tmp_path / "mounter.log", "wb"))
        deadline = time.time() + 10
        while not os.path.exists(sock):
            assert mounter.poll() is None and time.time() < deadline, open(tmp_path / "mounter.log").read()
            time.sleep(0.05)
        assert os.stat(sock).st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(sock)).st_mode & 0o777 == 0o700
    extra = f'[claims]\nmounter = "{sock}"\n' if through_mounter else ""
    agent = Agent(origin, extra=extra, cgroup=cg)
    base = tempfile.mkdtemp(prefix="strata-claim-mnt-")
    os.chmod(base, 0o755)
    mnt = os.path.join(base, "job", "train")
    try:
        agent.call("POST", "/v1/teams", {"name": "vision"})
        prefix = f"ds-outlive-{int(through_mounter)}/"
        objs = put_dataset(s3, prefix, [2 * MIB + 3, 17, MIB, 0])
        c = agent.ok("POST", "/v1/claims", {"version": 1, "job": f"job-outlive-{int(through_mounter)}",
                                            "team": "vision",
                                            "datasets": [{"name": "train", "location": f"origin/{prefix}",
                                                          "mount": mnt}]})
        c = agent.wait_settled(c["id"])
        assert c["state"] == "ready", c["reason"]
        keys = sorted(objs)
        path = lambda k: os.path.join(mnt, k[len(prefix):])  # noqa: E731
        with open(path(keys[0]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == objs[keys[0]]

        _kill_cgroup(cg)
        assert agent.proc.wait(timeout=10) is not None
        if not through_mounter:
            # The holder died with the agent's cgroup: the mount is gone, or answers ENOTCONN.
            time.sleep(0.5)
            if _mounted(mnt):
                with pytest.raises(OSError) as e:
                    os.listdir(mnt)
                assert e.value.errno == 107, e.value  # ENOTCONN
            return
        assert _mounted(mnt), "the mount went with the agent's cgroup"
        # A reader during the agent's absence waits for it, then gets every byte.
        got = {}

        def read_all():
            for k in keys:
                with open(path(k), "rb") as f:
                    got[k] = hashlib.sha256(f.read()).hexdigest()

        import threading
        t = threading.Thread(target=read_all)
        t.start()
        time.sleep(1)
        # (the file read before may come from the page cache; the others cannot come from anywhere)
        assert set(got) <= {keys[0]}, "a read of data never read answered while the agent was away"
        agent.start(listen=agent.api.removeprefix("http://"))
        t.join(timeout=60)
        assert not t.is_alive(), "a read did not finish after the agent came back"
        assert got == objs
        # Release, from the restarted agent, takes the mount down (by path: no mounter needed).
        agent.ok("POST", f"/v1/claims/{c['id']}/release", {"reason": "job ended"})
        deadline = time.time() + 10
        while _mounted(mnt):
            assert time.time() < deadline, "still mounted after release"
            time.sleep(0.1)
    finally:
        if _mounted(mnt):
            subprocess.run(["umount", "-l", mnt])
        if agent.proc.poll() is None:
            agent.close()
        else:
            shutil.rmtree(agent.dir, ignore_errors=True)
        if mounter is not None:
            mounter.terminate()
            mounter.wait(timeout=10)
        with contextlib.suppress(OSError):
            _kill_cgroup(cg)
            os.rmdir(cg)
        shutil.rmtree(base, ignore_errors=True)


def test_a_mount_that_would_hide_something_or_has_no_team_group_is_refused_with_the_field(agent, s3):
    _fuse_or_skip()
    _ensure_group_member("vision", "strata-vision")
    put_dataset(s3, "ds-mount-bad/", [MIB])
    base = tempfile.mkdtemp(prefix="strata-claim-mnt-")
    try:
        full = os.path.join(base, "full")
        os.makedirs(full)
        open(os.path.join(full, "mine.txt"), "w").close()
        agent.call("POST", "/v1/teams", {"name": "no-unix-group"})
        for team, mount, location, status, words in [
            ("vision", full, "origin/ds-mount-bad/", 400, "not empty"),
            ("vision", "/strata", "origin/ds-mount-bad/", 400, "two levels below /"),
            ("vision", "/proc/strata", "origin/ds-mount-bad/", 400, None),
            ("vision", os.path.join(base, "one"), "origin/ds-mount-bad/000-plain.bin", 400, "prefix"),
            ("no-unix-group", os.path.join(base, "x", "y"), "origin/ds-mount-bad/", 501, "Unix group"),
        ]:
            s, v = agent.call("POST", "/v1/claims", {"version": 1, "job": f"job-bad-{team}", "team": team,
                                                     "datasets": [{"name": "train", "location": location,
                                                                   "mount": mount}]})
            assert s == status and "datasets[0].mount" in v["message"], (mount, s, v)
            if words:
                assert words in v["message"], (mount, v)
        assert open(os.path.join(full, "mine.txt")).read() == ""
        assert not os.path.exists(os.path.join(base, "x")), "nothing is created for a refused claim"
        assert agent.ok("GET", "/v1/claims") == [], "nothing admitted"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_loaders_io_stall_is_in_the_claims_accounting_counted_once(agent, s3, s3_env, monkeypatch):
    strata = pytest.importorskip("strata")
    wds = pytest.importorskip("webdataset")
    d = tempfile.mkdtemp(prefix="strata-stall-ds-")
    try:
        with wds.ShardWriter(os.path.join(d, "shard-%05d.tar"), maxcount=50, verbose=0) as sink:
            for i in range(200):
                sink.write({"__key__": f"s{i:05d}", "bin": os.urandom(2000 + i)})
        for f in sorted(os.listdir(d)):
            s3.upload_file(os.path.join(d, f), BUCKET, f"ds-stall/{f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-stall", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-stall/",
                                                      "mode": "stream"}]})
    assert agent.wait_settled(c["id"])["state"] == "ready"
    # The job's environment, as `strata claim env` gives it.
    monkeypatch.setenv("STRATA_CLAIM", c["id"])
    monkeypatch.setenv("STRATA_JOB", "job-stall")
    monkeypatch.setenv("STRATA_AGENT", agent.api)
    monkeypatch.setenv("STRATA_TOKEN", ADMIN_TOKEN)
    ds = strata.StreamingDataset("s3://claims-origin/ds-stall", agent=agent.api, cache="agent", shuffle=False)
    assert len(list(ds)) == 200
    stall = ds.stats()["stall_seconds"]
    assert stall > 0, "a cold read through the agent waits for its first sample"
    u = agent.ok("GET", f"/v1/claims/{c['id']}")["usage"]
    assert abs(u["stall_secs"] - stall) < 0.002, (u, stall)
    # A reporter sends its running total: the same total again (a retry) counts once, a second reporter adds.
    for _ in range(2):
        agent.ok("POST", f"/v1/claims/{c['id']}/heartbeat", {"stall_secs": 1.5, "reporter": "other:1"})
    u = agent.ok("GET", f"/v1/claims/{c['id']}")["usage"]
    assert abs(u["stall_secs"] - (stall + 1.5)) < 0.002, (u, stall)
    # The job's analytics profile says it by reader (rank), most stalled first, beside its reads (the loader read
    # as the administrator, whose I/O has no team: one read names the claim's team, as a team's token would).
    req = urllib.request.Request(f"{agent.api}/v1/read?location=origin/ds-stall/shard-00000.tar",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "x-strata-team": "vision",
                                          "x-strata-job": "job-stall"})
    assert len(urllib.request.urlopen(req, timeout=30).read()) > 0
    prof = poll("the job's reads in its profile", lambda: (lambda s, v: v if s == 200 else None)(
        *agent.call("GET", "/v1/analytics/jobs/vision/job-stall")), timeout=10)
    readers = {r["reporter"]: r["stall_secs"] for r in prof["readers"]}
    mine = [k for k in readers if k.startswith(f"{socket.gethostname()}:{os.getpid()}:")]
    assert len(readers) == 2 and len(mine) == 1 and readers["other:1"] == 1.5, readers
    assert abs(readers[mine[0]] - stall) < 0.002, (readers, stall)
    assert [r["stall_secs"] for r in prof["readers"]] == sorted(readers.values(), reverse=True)
    assert prof["summary"]["ops"]["data_read"] > 0, prof["summary"]
    # A report is its reporter's total or nothing: half of one, a negative or infinite total are refused.
    for body in ({"stall_secs": 1.0}, {"reporter": "x"}, {"stall_secs": -1, "reporter": "x"},
                 {"stall_secs": "1e999", "reporter": "x"}, {"stall_secs": 1, "reporter": ""}):
        s, v = agent.call("POST", f"/v1/claims/{c['id']}/heartbeat", body)
        assert s == 400, (body, s, v)
    # After release the accounting is final and reports are refused.
    agent.ok("POST", f"/v1/claims/{c['id']}/release", {})
    final = agent.ok("GET", f"/v1/claims/{c['id']}")["usage"]["stall_secs"]
    assert abs(final - (stall + 1.5)) < 0.002
    s, v = agent.call("POST", f"/v1/claims/{c['id']}/heartbeat", {"stall_secs": 9.0, "reporter": "other:1"})
    assert s == 412, (s, v)


def test_a_job_named_by_another_team_is_not_charged_and_no_team_sees_anothers_jobs(agent, s3):
    """Issue 44, finding 4: `x-strata-job` (and `x-strata-team`) naming another team's job does not charge that
    team's claim, and `GET /v1/cache` shows each caller only the jobs of teams it reads."""
    put_dataset(s3, "ds-forge/", [MIB])
    c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-forge", "team": "vision",
                                        "datasets": [{"name": "train", "location": "origin/ds-forge/"}]})
    agent.wait_settled(c["id"])
    before = agent.ok("GET", f"/v1/claims/{c['id']}")["usage"]["origin_bytes"]
    other = agent.token("audio", "member", "audio-forger")
    own = put_dataset(s3, "audio-own/", [3 * MIB])
    for key in own:
        req = urllib.request.Request(agent.api + "/v1/read?location=" + urllib.parse.quote(f"origin/{key}", safe=""),
                                     headers={"Authorization": f"Bearer {other}", "x-strata-job": "job-forge",
                                              "x-strata-team": "vision"})
        with urllib.request.urlopen(req) as r:
            assert len(r.read()) == 3 * MIB
    after = agent.ok("GET", f"/v1/claims/{c['id']}")["usage"]["origin_bytes"]
    assert after == before, (before, after)
    # the audio member's own I/O is audio's, whatever team it named
    rows = agent.ok("GET", "/v1/cache", token=other)["by_job"]
    assert rows and all(r.get("team") == "audio" for r in rows), rows
    assert sum(r["origin_bytes"] for r in rows) >= 3 * MIB, rows
    # vision's member sees vision's job, not audio's rows
    member = agent.token("vision", "member", "vision-jobs")
    rows = agent.ok("GET", "/v1/cache", token=member)["by_job"]
    assert rows and all(r.get("team") == "vision" for r in rows), rows
    assert any(r["job"] == "job-forge" for r in rows), rows
    agent.ok("POST", f"/v1/claims/{c['id']}/release", {})


def test_the_readmes_claim_validates_without_a_job(tmp_path):
    """Issue 44, finding 13: a claim file leaves its job to the submitter (the README's own example); `strata
    claim validate FILE` checks the rest and says so, from a file and from stdin."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")).read()
    yaml_text = readme.split("# /shared/claims/train.yaml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    f = write_claim(tmp_path, yaml_text)
    r = subprocess.run([STRATA, "claim", "validate", f], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "set at submission" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([STRATA, "claim", "validate", "-", "--json"], input=yaml_text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["job"] is None, r.stdout + r.stderr
    # a bad job is still refused, naming the field
    r = subprocess.run([STRATA, "claim", "validate", f, "--job", "a b"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "job" in r.stderr, r.stderr


def test_a_claim_released_mid_staging_accounts_for_the_fills_it_had_in_flight(origin, s3):
    """Issue 44, finding 12: fills a staging had in flight when its claim was released go on (readers may have
    joined them); the claim's final `origin_bytes` includes what they read, as the cache's by-job counters do."""
    import threading
    from test_shared_cache import Proxy

    class Gate:
        def __init__(self):
            self.open = threading.Event()
            self.waiting = 0
            self.lock = threading.Lock()

        def before(self, method, path):
            if method == "GET" and "list-type=" not in path and "/ds-inflight/" in path:
                with self.lock:
                    self.waiting += 1
                self.open.wait(timeout=300)

    put_dataset(s3, "ds-inflight/", [2 * MIB] * 6)
    gate = Gate()
    proxy = Proxy(origin.split("//", 1)[1], before=gate.before)
    agent = Agent(f"http://{proxy.addr}", ram="16MiB", disk="64MiB")
    try:
        agent.call("POST", "/v1/teams", {"name": "vision"})
        c = agent.ok("POST", "/v1/claims", {"version": 1, "job": "job-inflight", "team": "vision",
                                            "datasets": [{"name": "train", "location": "origin/ds-inflight/"}]})
        deadline = time.time() + 60
        while gate.waiting == 0:
            assert time.time() < deadline, "staging never reached the origin"
            time.sleep(0.05)
        released = []
        t = threading.Thread(target=lambda: released.append(
            agent.call("POST", f"/v1/claims/{c['id']}/release", {})))
        t.start()
        time.sleep(0.5)  # the release is under way, its staging's fills held at the origin
        gate.open.set()
        t.join(timeout=120)
        assert released and released[0][0] == 200, released

        def job_origin():
            return sum(r["origin_bytes"] for r in agent.cache()["by_job"]
                       if r["job"] == "job-inflight" and r.get("team", "vision") == "vision")
        # What the fills read, once they have all landed (stable for a second).
        seen, stable_since = job_origin(), time.time()
        while time.time() - stable_since < 1.0:
            time.sleep(0.1)
            now = job_origin()
            if now != seen:
                seen, stable_since = now, time.time()
        assert seen > 0
        final = agent.ok("GET", f"/v1/claims/{c['id']}")
        assert final["state"] == "released", final
        assert final["usage"]["origin_bytes"] == seen, (final["usage"], seen)
    finally:
        gate.open.set()
        agent.close()
        proxy.close()
