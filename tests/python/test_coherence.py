"""Read-after-write across the agents of a cluster (docs/consistency.md): a write or delete acknowledged by one
agent is what every other agent serves next, the new version or 404, never the old one; through the shared
cache too (an owner never serves a replaced version to a peer).

Two and three agents on loopback, sharing a PostgreSQL catalog (membership from it) and one S3 server (moto),
each with its own S3 gateway, read with boto3. Metadata TTLs are the default (60 s): without the invalidations
the other agents would serve the old version for up to a minute. The partition case is in
test_coherence_netns.py.
"""
import concurrent.futures
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import botocore.exceptions
import pytest

from conftest import ADMIN_TOKEN, client
from test_shared_cache import (  # noqa: F401 - fixtures
    BLOCK, CAPS, CATALOG_CLUSTER, CATALOG_KEY, GW_KEY, SECRET, GW_SECRET, MIB, bucket, catalog_agent, cluster, pg_databases, pg_url, poll, post_json, sees)


def gateway(agent):
    return client(f"http://127.0.0.1:{agent.s3_port}", GW_KEY, GW_SECRET)


def catalog_cluster(cluster, origin, name, url, n):
    agents = [catalog_agent(cluster, origin, name, url) for _ in range(n)]
    for a in agents:
        a.start(wait=False)
    for a in agents:
        a.wait_ready()
    poll(f"{n} catalog agents see each other", lambda: sees(agents, agents), timeout=20)
    poll("every agent trusts its metadata (in contact with every member)",
         lambda: all(a.cluster()["coherence"]["trusted"] for a in agents), timeout=20)
    return agents


def body_of(key, n, size):
    """Version n of key: its name and number first, then bytes of its own."""
    head = f"{key}#{n}#".encode()
    rnd = random.Random(f"{key}/{n}").randbytes(max(0, size - len(head)))
    return head + rnd


def version_in(body):
    return int(body.split(b"#", 2)[1])


def fetch(s3, key):
    """The body through this gateway, or None for 404."""
    try:
        return s3.get_object(Bucket="default", Key=key)["Body"].read()
    except botocore.exceptions.ClientError as e:
        if e.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise


def write_and_check(n, gws, agents, keys, rng, history, lock, problems):
    """300 writes and deletes, each through a random agent, each read at once through every other."""
    for op in range(1, 301):
        k = rng.choice(keys)
        w = rng.randrange(n)
        if rng.random() < 0.3:
            gws[w].delete_object(Bucket="default", Key=k)
            state = None
        else:
            # Sizes from one block to past two: blocks owned by different agents, read through the peers.
            size = rng.choice([1000, BLOCK + 17, 2 * BLOCK + 4321])
            gws[w].put_object(Bucket="default", Key=k, Body=body_of(k, op, size))
            state = op
        with lock:
            history[k].append(state)
        # Read at once through every other agent: the new version, or 404 after a delete.
        for j in range(n):
            if j == w:
                continue
            got = fetch(gws[j], k)
            v = None if got is None else version_in(got)
            if v != state:
                problems.append((agents[j].name, k, "right after op", op, "by", agents[w].name,
                                 "served", v, "want", state))


@pytest.mark.parametrize("n", [2, 3])
def test_a_write_or_delete_through_one_agent_is_what_every_other_serves_next(origin, bucket, cluster, pg_url, n):
    name, _ = bucket
    agents = catalog_cluster(cluster, origin, name, pg_url, n)
    gws = [gateway(a) for a in agents]
    # Ugly names too: the announcement carries the key as the gateway stored it.
    keys = ["coh/plain.bin", "coh/with space+plus%25.bin", "coh/ünï/日本.bin", "coh/dir/"]
    rng = random.Random(n)
    # history[key]: acknowledged states in order, (op, version or None for deleted).
    history = {k: [] for k in keys}
    lock = threading.Lock()
    for k in keys:
        gws[0].put_object(Bucket="default", Key=k, Body=body_of(k, 0, 3000))
        with lock:
            history[k].append(0)
    # Every agent has the first versions in its metadata cache (and, past one block, in the shared cache).
    for g in gws:
        for k in keys:
            assert version_in(fetch(g, k)) == 0
    stop = threading.Event()
    problems, seen = [], []

    def reader(j):
        s3 = gateway(agents[j % n])
        r = random.Random(j)
        while not stop.is_set():
            k = r.choice(keys)
            with lock:
                floor = len(history[k]) - 1  # the last acknowledged state when the read starts
            got = fetch(s3, k)
            v = None if got is None else version_in(got)
            if got is not None and got != body_of(k, v, len(got)):
                problems.append((agents[j % n].name, k, "bytes of no version", v))
            seen.append((agents[j % n].name, k, floor, v))

    def reader_checked(j):
        try:
            reader(j)
        except Exception as e:  # noqa: BLE001 - reported below
            problems.append(("reader", j, repr(e)))

    with concurrent.futures.ThreadPoolExecutor(2 * n) as ex:
        futs = [ex.submit(reader_checked, j) for j in range(2 * n)]
        try:
            write_and_check(n, gws, agents, keys, rng, history, lock, problems)
        finally:
            stop.set()
        for f in futs:
            f.result()
    # A concurrent read returns the state acknowledged when it started, or a later one (an op in flight
    # then, acknowledged since): never an older one.
    for who, k, floor, v in seen:
        if v not in history[k][floor:]:
            problems.append((who, k, "served", v, "after", history[k][floor], "was acknowledged"))
    assert not problems, (problems[:10], cluster.logs())
    assert len(seen) > 100, len(seen)
    st = [a.cluster()["coherence"] for a in agents]
    assert all(s["received"] > 0 and s["unanswered"] == 0 for s in st), st


def test_an_owner_never_serves_a_replaced_version_to_a_peer(origin, bucket, cluster, pg_url):
    name, _ = bucket
    agents = catalog_cluster(cluster, origin, name, pg_url, 3)
    gws = [gateway(a) for a in agents]
    key = "peer/same-size.bin"
    size = 8 * BLOCK + 99  # blocks spread over the three owners
    gws[0].put_object(Bucket="default", Key=key, Body=body_of(key, 0, size))
    for round_ in range(1, 7):
        # Every agent holds the current version (its own blocks, its peers' through them).
        for g in gws:
            assert version_in(fetch(g, key)) == round_ - 1
        asked = sum(a.cluster()["asked"] for a in agents)
        assert asked > 0, "the blocks were read through their owners"
        # The same size, another version: only the ETag tells them apart.
        w = round_ % 3
        new = body_of(key, round_, size)
        gws[w].put_object(Bucket="default", Key=key, Body=new)
        for j, g in enumerate(gws):
            got = fetch(g, key)
            assert got is not None and hashlib.md5(got).digest() == hashlib.md5(new).digest(), (
                f"round {round_}: {agents[j].name} served version {version_in(got) if got else None} "
                f"after {agents[w].name} wrote {round_}", cluster.logs())
    # Deleted through one: 404 through the others at once, though their blocks are cached.
    gws[1].delete_object(Bucket="default", Key=key)
    for g in gws:
        assert fetch(g, key) is None


def test_delete_objects_and_copies_are_announced_too(origin, bucket, cluster, pg_url):
    name, _ = bucket
    a, b = catalog_cluster(cluster, origin, name, pg_url, 2)
    ga, gb = gateway(a), gateway(b)
    keys = [f"batch/{i:03d}.bin" for i in range(40)]
    for k in keys:
        ga.put_object(Bucket="default", Key=k, Body=body_of(k, 0, 500))
    for k in keys:
        assert version_in(fetch(gb, k)) == 0
    r = ga.delete_objects(Bucket="default", Delete={"Objects": [{"Key": k} for k in keys[:20]]})
    assert len(r.get("Deleted", [])) == 20, r
    for k in keys[:20]:
        assert fetch(gb, k) is None, k
    # A copy onto a key B has cached.
    gb.put_object(Bucket="default", Key="batch/src.bin", Body=body_of("batch/src.bin", 7, 700))
    ga.copy_object(Bucket="default", Key=keys[30], CopySource={"Bucket": "default", "Key": "batch/src.bin"})
    assert version_in(fetch(gb, keys[30])) == 7
    # A multipart upload completed through B, read through A that had the old version.
    assert version_in(fetch(ga, keys[31])) == 0
    up = gb.create_multipart_upload(Bucket="default", Key=keys[31])["UploadId"]
    part = body_of(keys[31], 9, 5 * MIB)
    e1 = gb.upload_part(Bucket="default", Key=keys[31], UploadId=up, PartNumber=1, Body=part)["ETag"]
    gb.complete_multipart_upload(Bucket="default", Key=keys[31], UploadId=up,
                                 MultipartUpload={"Parts": [{"ETag": e1, "PartNumber": 1}]})
    assert version_in(fetch(ga, keys[31])) == 9


def put_json(agent, path, body):
    req = urllib.request.Request(f"{agent.api}{path}", data=json.dumps(body).encode(), method="PUT",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def test_a_clean_up_run_and_restore_through_one_agent_are_seen_through_the_other_at_once(origin, bucket, cluster,
                                                                                          pg_url):
    name, s3 = bucket
    a, b = catalog_cluster(cluster, origin, name, pg_url, 2)
    keys = [f"vision/tmp/old{i}.bin" for i in range(5)]
    for k in keys:
        s3.put_object(Bucket=name, Key=k, Body=body_of(k, 0, 2 * BLOCK + 5))
    # B knows every one of them (metadata and blocks).
    for k in keys:
        assert version_in(b.read(k)) == 0
    assert post_json(a, "/v1/teams", {"name": "vision"})[0] in (200, 201)
    assert put_json(a, "/v1/prefixes", {"backend": "default", "prefix": "vision/", "team": "vision"}) in (200, 201)
    s_, pol = post_json(a, "/v1/policies", {"team": "vision", "backend": "default", "kind": "ttl",
                                           "prefix": "vision/tmp", "age_secs": 1})
    assert s_ in (200, 201), pol
    time.sleep(2.1)
    s_, plan = post_json(a, "/v1/cleanup/plans", {"team": "vision"})
    assert s_ in (200, 201) and sorted(i["key"] for i in plan["items"]) == keys, plan
    s_, run = post_json(a, "/v1/cleanup/plans/" + plan["plan"]["id"] + "/run", {})
    assert s_ == 200 and run["trashed"] == 5, run
    # Moved to the trash through A: 404 through B at once, though B had them cached.
    for k in keys:
        with pytest.raises(urllib.error.HTTPError) as e:
            b.read(k)
        assert e.value.code == 404, k
        assert fetch(gateway(b), k) is None, k
    s_, restored = post_json(a, "/v1/cleanup/plans/" + plan["plan"]["id"] + "/restore", {})
    assert s_ == 200 and restored["restored"] == 5, restored
    for k in keys:
        assert version_in(b.read(k)) == 0
    assert b.cluster()["coherence"]["applied"] >= 10


SAVE = r"""
import sys, numpy as np, strata
local, remote, agent, step = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = strata.Checkpointer("run-c", local, remote, rank=0, world_size=1, agent=agent, keep_remote=1)
h = c.save(step, {"w": np.full(1 << 18, step, dtype=np.float32), "step": step})
print(h.wait_released(), flush=True)
"""


def test_a_handed_over_checkpoint_save_and_its_retention_are_seen_through_the_other_agent_at_once(
        origin, bucket, cluster, pg_url):
    name, s3 = bucket
    agents = []
    for i in range(2):
        nvme = os.path.join(cluster.root, f"nvme{i}")
        os.makedirs(nvme)
        agents.append(cluster.add(
            origin, name, CATALOG_CLUSTER,
            extra=f'[catalog]\nurl = "{pg_url}"\n[[backends]]\nname = "nvme"\nurl = "file://{nvme}"',
            disk=f"{CAPS[f'agent{i}'] // MIB}MiB", env={"STRATA_CATALOG_KEY": CATALOG_KEY}))
    for a in agents:
        a.start()
    poll("two agents see each other", lambda: sees(agents, agents), timeout=20)
    poll("both trust their metadata", lambda: all(a.cluster()["coherence"]["trusted"] for a in agents), timeout=20)
    a, b = agents
    local = os.path.join(cluster.root, "nvme0", "ckpt")
    remote = f"s3://{name}/ckpt"

    def save(step):
        out = subprocess.run([sys.executable, "-c", SAVE, local, remote, a.api, str(step)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        poll(f"step {step} uploaded by the agent",
             lambda: json.loads(urllib.request.urlopen(urllib.request.Request(
                 f"{a.api}/v1/ckpt/handoff?run=run-c&step={step}&rank=0",
                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})).read())["state"] == "done", timeout=60)

    def stored():
        return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=name, Prefix="ckpt/").get("Contents", []))

    save(1)
    step1 = [k for k in stored() if k.startswith("ckpt/run-c/")]
    assert step1, stored()
    # B reads step 1 (and keeps its metadata for the TTL).
    for k in step1:
        b.read(k)
    save(2)  # keep_remote=1: the agent's retention deletes step 1 before the save is done
    gone = [k for k in step1 if k not in stored()]
    assert gone, (step1, stored())
    for k in gone:
        with pytest.raises(urllib.error.HTTPError) as e:
            b.read(k)
        assert e.value.code == 404, k


def test_announcements_take_only_the_cluster_credential_and_a_member_id(origin, bucket, cluster, pg_url):
    name, _ = bucket
    a, b = catalog_cluster(cluster, origin, name, pg_url, 2)
    gateway(a).put_object(Bucket="default", Key="guard/k", Body=body_of("guard/k", 0, 100))
    assert version_in(fetch(gateway(b), "guard/k")) == 0
    change = {"from": a.me, "changes": [{"backend": "x", "key": "guard/k"}]}
    cluster_key = {"x-strata-cluster-key": SECRET}
    # No credential, a user's (the administrator's) token, a wrong secret: refused, nothing dropped.
    assert post_json(b, "/v1/peer/invalidate", change, token=None)[0] in (401, 403)
    assert post_json(b, "/v1/peer/invalidate", change)[0] == 403
    assert post_json(b, "/v1/peer/invalidate", change, token=None,
                     headers={"x-strata-cluster-key": "not-the-secret-0123456789"})[0] in (401, 403)
    # Malformed: a clear 400 naming what is wrong.
    for bad, word in [({"from": "garbage", "changes": []}, "member id"),
                      ({"from": a.me, "changes": [{"backend": "x", "key": "k"}] * 1001}, "at most 1000"),
                      ({"from": a.me, "changes": [{"backend": "x"}]}, "announcement"),
                      ({"from": a.me, "bogus": 1}, "announcement")]:
        s_, err = post_json(b, "/v1/peer/invalidate", bad, token=None, headers=cluster_key)
        assert s_ == 400 and word in err["message"], (bad if len(str(bad)) < 200 else word, s_, err)
    assert b.cluster()["coherence"]["received"] >= 1  # the real ones, from a's write and probes
