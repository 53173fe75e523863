"""Read-after-write across a partition (docs/consistency.md): a member cut off from the cluster (its link taken
down) while a write and a delete are acknowledged elsewhere serves the replaced version no longer than its
metadata lease, and the new state at once when healed; the writer's acknowledgement waits for the silent member
at most about a lease, never forever.

Four agents in network namespaces on a bridge (the harness of test_shared_cache_netns.py), metadata TTL 60 s,
lease 2 s. The partitioned node's reads come from a client inside its own namespace, which still reaches it.
"""
import json
import os
import subprocess
import sys
import time

import botocore.exceptions
import pytest

from conftest import ADMIN_TOKEN, client, poll
from test_shared_cache_netns import API_PORT, S3_PORT, Net, addr, ns, running

LEASE_S = 2.0
KEY, SECRET = "netns-coherence-key", "netns-coherence-secret-0123456789"
BLOCK = 256 * 1024

READER = r"""
import json, sys, time, urllib.error, urllib.parse, urllib.request
api, token, until = sys.argv[1], sys.argv[2], float(sys.argv[3])
keys = sys.argv[4:]
while time.time() < until:
    for k in keys:
        t = time.time()
        q = urllib.parse.quote(f"default/{k}", safe="")
        req = urllib.request.Request(f"{api}/v1/read?location={q}", headers={"Authorization": f"Bearer {token}"})
        out = {"t": t, "key": k}
        try:
            with urllib.request.urlopen(req, timeout=3) as r:
                body = r.read()
                out["v"] = int(body.split(b"#", 2)[1])
        except urllib.error.HTTPError as e:
            out["status"] = e.code
        except Exception as e:  # timeouts, resets: the origin is out of reach too
            out["err"] = type(e).__name__
        print(json.dumps(out), flush=True)
    time.sleep(0.05)
"""


class LeaseNet(Net):
    """The four-namespace harness with a metadata TTL, a short lease and gateway keys."""

    def config(self, i):
        path = super().config(i)
        with open(path) as f:
            text = f.read()
        text = text.replace("metadata_ttl_ms = 0", "metadata_ttl_ms = 60000")
        text = text.replace("peer_timeout_ms = 3000",
                            f"peer_timeout_ms = 1000\nmetadata_lease_ms = {int(LEASE_S * 1000)}")
        text += f"""
[[gateway.keys]]
access_key = "{KEY}"
secret_key = "{SECRET}"
principal = "writer"
"""
        with open(path, "w") as f:
            f.write(text)
        return path


@pytest.fixture(scope="module")
def lnet():
    yield from running(LeaseNet)


def body(key, v, size=3 * BLOCK + 11):
    head = f"{key}#{v}#".encode()
    return head + bytes([v % 251]) * (size - len(head))


def gateway(i):
    return client(f"http://{addr(i)}:{S3_PORT}", KEY, SECRET)


def coherence(net, i):
    return net.cluster(i)["coherence"]


def test_a_partitioned_member_serves_no_replaced_version_past_its_lease_and_the_new_one_once_healed(lnet):
    w = gateway(1)
    changed, deleted = "part/changed.bin", "part/deleted.bin"
    w.put_object(Bucket="default", Key=changed, Body=body(changed, 0))
    w.put_object(Bucket="default", Key=deleted, Body=body(deleted, 0))
    poll("every member trusts its metadata", lambda: all(coherence(lnet, i)["trusted"] for i in range(1, 5)),
         timeout=20)
    # Node 4 holds both (metadata and blocks).
    for k in (changed, deleted):
        assert int(lnet.read(4, k).split(b"#", 2)[1]) == 0
    t_cut = time.time()
    until = t_cut + 4 * LEASE_S + 8
    reader = subprocess.Popen(
        ["ip", "netns", "exec", ns(4), sys.executable, "-c", READER, f"http://{addr(4)}:{API_PORT}", ADMIN_TOKEN,
         str(until), changed, deleted],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        lnet.link(4, "down")
        t_cut = time.time()
        # Acknowledged elsewhere while node 4 cannot be told.
        t0 = time.time()
        w.put_object(Bucket="default", Key=changed, Body=body(changed, 1))
        gateway(2).delete_object(Bucket="default", Key=deleted)
        acked = time.time() - t0
        time.sleep(3 * LEASE_S)
        lnet.link(4, "up")
        t_heal = time.time()
        out, err = reader.communicate(timeout=until - time.time() + 30)
    finally:
        if reader.poll() is None:
            reader.kill()
        lnet.link(4, "up")
    reads = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert reads, err
    # The writes did not wait forever for the silent member (they returned; boto3 gives up after 60 s): they
    # waited for its lease, counted by the writer.
    assert coherence(lnet, 1)["waited_ms"] > 0, acked
    # Past its lease, node 4 never served what the cluster had replaced: the new version, 404 or an error
    # (its origin was out of reach too), never version 0 of the changed key nor any of the deleted one.
    bound = t_cut + LEASE_S + 0.25
    stale = [r for r in reads if r["t"] > bound
             and ((r["key"] == changed and r.get("v") == 0) or (r["key"] == deleted and "v" in r))]
    assert not stale, (stale[:5], t_cut, bound)
    during = [r for r in reads if bound < r["t"] < t_heal]
    assert during, "node 4 was read while cut off"
    # Healed: the new state at once (reads starting a moment after the link came back).
    after = [r for r in reads if r["t"] > t_heal + 1.0]
    assert after, reads[-5:]
    for r in after:
        if r["key"] == changed:
            assert r.get("v") == 1, r
        else:
            assert r.get("status") == 404, r
    c4, c1 = coherence(lnet, 4), coherence(lnet, 1)
    assert c4["lapses"] >= 1 and c1["unanswered"] >= 1, (c4, c1)
    poll("node 4 trusts its metadata again", lambda: coherence(lnet, 4)["trusted"], timeout=10)
    # The rest of the cluster reads the new state too.
    for i in (2, 3):
        assert int(lnet.read(i, changed).split(b"#", 2)[1]) == 1
        with pytest.raises(Exception):
            lnet.read(i, deleted)
    try:
        gateway(3).head_object(Bucket="default", Key=deleted)
        raise AssertionError("deleted key still there")
    except botocore.exceptions.ClientError as e:
        assert e.response["Error"]["Code"] in ("404", "NoSuchKey")
    assert os.path.exists(lnet.dir)
