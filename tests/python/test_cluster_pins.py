"""Pins across the cluster: a claim's `pin` dataset (or an operator's pin) is kept by every member for the blocks
it owns, since staging spreads a dataset's blocks over their owners; released with the claim everywhere; kept
across a member's restart; the route takes only the cluster credential and a member id.

Three real agents (`cache = "static"`) in front of moto, as in test_shared_cache.py.
"""
import json

from test_shared_cache import (ADMIN_TOKEN, SECRET, bucket, cluster, make_objects, poll,  # noqa: F401 (fixtures)
                               post_json, settled, static_cluster, upload)


def cache_of(agent):
    return agent.get_json("/v1/cache")


def pinned(agent):
    return cache_of(agent)["disk"]["pinned_bytes"]


def test_a_claims_pin_dataset_is_pinned_on_every_member_for_the_blocks_it_holds(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(90, 8, prefix="pinned/")
    upload(s3, name, objects)
    size = sum(len(v) for v in objects.values())
    a, b, c = static_cluster(cluster, 3, origin, name)
    poll("three members", lambda: all(len(x.cluster()["members"]) == 3 for x in (a, b, c)), timeout=15)
    post_json(a, "/v1/teams", {"name": "vision"})
    s, claim = post_json(a, "/v1/claims", {"version": 1, "job": "job-pin", "team": "vision", "datasets": [
        {"name": "weights", "location": "default/pinned/", "mode": "pin"}]})
    assert s == 200, claim
    got = settled(a, claim["id"])
    assert got["state"] == "ready", (got, cluster.logs())
    # Every member holds its share of the blocks, pinned: the shares add up to the whole dataset.
    poll("the pin kept by every member", lambda: all(
        x.cluster()["pins"]["kept_for"] == [a.me] for x in (b, c)), timeout=30)
    shares = poll("every block pinned where it is held", lambda: (lambda p: p if sum(p.values()) == size else None)(
        {x.name: pinned(x) for x in (a, b, c)}), timeout=30)
    assert all(v > 0 for v in shares.values()), shares
    for x in (b, c):
        pins = cache_of(x)["pins"]
        assert pins == [{"backend": pins[0]["backend"], "prefix": "pinned/", "from": a.me}], pins
    assert [p.get("from") for p in cache_of(a)["pins"]] == [None], "the staging agent's own pin"

    # A member restarted keeps the pins it held for the others (and hears them again).
    c.kill()
    c.start()
    assert pinned(c) == shares[c.name], "re-pinned at start"
    poll("the restarted member hears the pins again", lambda: c.cluster()["pins"]["received"] > 0, timeout=30)
    assert cache_of(c)["pins"][0]["from"] == a.me

    # Released: no member keeps the pin, nothing is pinned anywhere.
    s, r = post_json(a, f"/v1/claims/{claim['id']}/release", {"reason": "done"})
    assert s == 200, r
    poll("the pin gone from every member", lambda: all(
        not x.cluster()["pins"]["kept_for"] and pinned(x) == 0 for x in (a, b, c)), timeout=30)
    assert all(cache_of(x)["pins"] == [] for x in (a, b, c))


def test_an_operators_pin_and_unpin_reach_every_member(origin, bucket, cluster):
    name, s3 = bucket
    objects = make_objects(91, 6, prefix="op-pin/")
    upload(s3, name, objects)
    a, b = static_cluster(cluster, 2, origin, name)
    poll("two members", lambda: all(len(x.cluster()["members"]) == 2 for x in (a, b)), timeout=15)
    s, r = post_json(b, "/v1/cache/pin", {"location": "default/op-pin/"})
    assert s == 200, r
    poll("b's pin kept by a", lambda: a.cluster()["pins"]["kept_for"] == [b.me], timeout=30)
    # Blocks read afterwards are pinned wherever they are held.
    for k in objects:
        assert a.read(k) == objects[k]
    size = sum(len(v) for v in objects.values())
    # a read them all (keeping a copy of what b owns, pinned too); b holds its owned share, pinned by its pin.
    poll("the read blocks pinned", lambda: pinned(a) == size and 0 < pinned(b) < size, timeout=30)
    s, r = post_json(b, "/v1/cache/unpin", {"location": "default/op-pin/"})
    assert s == 200, r
    poll("b's pin gone from a", lambda: not a.cluster()["pins"]["kept_for"] and pinned(a) == 0, timeout=30)


def test_the_pins_route_takes_only_the_cluster_credential_and_a_member_id(origin, bucket, cluster):
    name, _ = bucket
    a, b = static_cluster(cluster, 2, origin, name)
    body = {"from": "http://127.0.0.1:9", "pins": [{"backend": "s3://x", "prefix": "p/"}]}
    for token, headers in [(None, {}), (ADMIN_TOKEN, {}), (None, {"x-strata-cluster-key": "forged"})]:
        s, v = post_json(b, "/v1/peer/pins", body, token=token, headers=headers)
        assert s in (401, 403), (token, headers, s, v)
    key = {"x-strata-cluster-key": SECRET}
    for bad, why in [({**body, "from": "garbage"}, "member id"),
                     ({**body, "from": b.me}, "own id"),
                     ({**body, "pins": [{"backend": "s3://x", "prefix": "p/"}] * 10_001}, "at most"),
                     ({**body, "pins": [{"backend": "", "prefix": "p/"}]}, "backend id"),
                     ({**body, "extra": 1}, "unknown field")]:
        s, v = post_json(b, "/v1/peer/pins", bad, token=None, headers=key)
        assert s == 400 and why in json.dumps(v), (bad["from"], s, v)
    assert cache_of(b)["pins"] == [] and b.cluster()["pins"]["kept_for"] == []
    # The real thing is taken and replaced as a whole.
    s, v = post_json(b, "/v1/peer/pins", body, token=None, headers=key)
    assert s == 204, v
    assert b.cluster()["pins"]["kept_for"] == ["http://127.0.0.1:9"]
    s, v = post_json(b, "/v1/peer/pins", {**body, "pins": []}, token=None, headers=key)
    assert s == 204 and cache_of(b)["pins"] == [], v
