"""Resilience end to end: a training loop SIGKILLed at random steps again and again, resuming from its
checkpoints (exactly-once samples, every committed step in the object store, the same model as an uninterrupted
run); and objects overwritten at the origin, behind the gateway's back, while readers stream them through it
(every body complete and of one version)."""
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from botocore.exceptions import BotoCoreError, ClientError

from conftest import ORIGIN_KEY, ORIGIN_SECRET, client

strata = pytest.importorskip("strata")
torch = pytest.importorskip("torch")
wds = pytest.importorskip("webdataset")


# ---------------------------------------------------------------------------------------------------------------
# A training loop killed at random steps


SAMPLES, PER_SHARD, BATCH, EVERY, FEATURES = 800, 50, 8, 5, 16
STEPS = SAMPLES // BATCH  # one epoch, world size 1, nothing dropped
RUN = "run-resilience"

TRAIN = r"""
import json, os, signal, sys
import numpy as np
import torch
import strata

url, log_path, local, remote, out = sys.argv[1:6]
kill_step = int(sys.argv[6])
BATCH, EVERY, FEATURES, RUN = int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9]), sys.argv[10]
torch.set_num_threads(1)   # one thread: the same float sums in every process
torch.manual_seed(1234)
model = torch.nn.Linear(FEATURES, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
ckpt = strata.Checkpointer(RUN, local, remote, rank=0, world_size=1, agent="", keep_local=0, keep_remote=0)
ds = strata.StreamingDataset(url, shuffle=True, seed=77, shuffle_window=64, batch_size=BATCH, cache="local",
                             rank=0, world_size=1)
step = 0
got = ckpt.load_latest()
if got is not None:
    step, st = got
    assert st["step"] == step, (st["step"], step)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    ds.load_state_dict(st["loader"])
start = step
log = open(log_path, "a")

def record(**kw):
    log.write(json.dumps(kw) + "\n")
    log.flush()
    os.fsync(log.fileno())

record(start=start, pid=os.getpid(), kill=kill_step)
dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=lambda b: b)
handles = {}
for batch in dl:
    step += 1
    x = torch.from_numpy(np.stack([np.frombuffer(s["x"], dtype=np.float32) for s in batch]))
    y = torch.tensor([[float(s["y"].decode())] for s in batch], dtype=torch.float32)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    record(step=step, ids=[s["__key__"] for s in batch])
    if step % EVERY == 0:
        handles[step] = ckpt.save(step, {
            "model": model.state_dict(), "opt": opt.state_dict(), "step": step,
            "loader": ds.state_dict(consumed=(step - start) * BATCH)})
    if step == kill_step:
        # What this process knew when it died: a save `done` is durable in both tiers and must never be lost.
        record(killing=step, handles={str(s): h.state for s, h in handles.items()})
        os.kill(os.getpid(), signal.SIGKILL)
ckpt.flush()
if ckpt.pending_uploads is not None:
    ckpt.pending_uploads.join(timeout=120)   # a daemon thread: not waited for at exit
torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
record(finished=step, handles={str(s): h.state for s, h in handles.items()})
"""


def write_dataset(d):
    """SAMPLES tiny samples (FEATURES float32 and a target), tar shards written by webdataset itself."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(5)
    w_true = rng.normal(size=FEATURES).astype(np.float32)
    keys = []
    with wds.ShardWriter(os.path.join(d, "shard-%05d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i in range(SAMPLES):
            x = rng.normal(size=FEATURES).astype(np.float32)
            y = float(x @ w_true + rng.normal() * 0.1)
            key = f"s{i:05d}"
            sink.write({"__key__": key, "x": x.tobytes(), "y": repr(y).encode()})
            keys.append(key)
    return keys


def run_trainer(script, args, kill_step, log_dir, timeout=180):
    """Run one trainer process (its own process group, so its DataLoader workers go with it); its exit status."""
    with open(os.path.join(log_dir, "trainer.out"), "ab") as out:
        p = subprocess.Popen([sys.executable, str(script), *args, str(kill_step), str(BATCH), str(EVERY),
                              str(FEATURES), RUN], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        finally:
            try:  # the workers of a SIGKILLed trainer (or of one past its deadline) go too
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def read_log(path):
    """The runs in a trainer log: [{"start", "kill", "steps": {step: ids}, "killing"/"finished": {...}}]."""
    runs = []
    for line in open(path).read().splitlines():
        if not line.endswith("}"):
            continue  # a line cut by the kill (never: each is fsync'd before the next step)
        r = json.loads(line)
        if "start" in r:
            runs.append({"start": r["start"], "kill": r["kill"], "steps": {}, "order": []})
        elif "step" in r:
            runs[-1]["steps"][r["step"]] = r["ids"]
            runs[-1]["order"].append(r["step"])
        elif "killing" in r:
            runs[-1]["killing"] = r
        elif "finished" in r:
            runs[-1]["finished"] = r
    return runs


def remote_steps(s3, bucket, prefix):
    """Steps committed in the object store tier: those whose manifest is there (listed, not loaded)."""
    steps = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/{RUN}/"):
        for o in page.get("Contents", []):
            parts = o["Key"].split("/")
            if parts[-1] == "manifest.json" and parts[-2].startswith("step-"):
                steps.add(int(parts[-2][len("step-"):]))
    return steps


def local_steps(local):
    d = os.path.join(local, RUN)
    return {int(n[len("step-"):]) for n in os.listdir(d)
            if n.startswith("step-") and os.path.exists(os.path.join(d, n, "manifest.json"))}


def test_a_training_loop_killed_at_random_steps_resumes_exactly_once(tmp_path, s3_env):
    """A torch training loop (DataLoader, 2 workers; samples streamed from S3; a checkpoint every EVERY steps to
    a local tier and S3) SIGKILLs itself at 4 random steps, each run resuming from the newest checkpoint, then
    runs to the end of the epoch. The steps each run committed (up to the step the next run resumed from)
    consume the epoch exactly once; every step committed locally is committed in S3; the final model is bit
    for bit the model of an uninterrupted run."""
    s3 = s3_env
    bucket = f"resilience-{random.randrange(1 << 30)}"
    s3.create_bucket(Bucket=bucket)
    data = str(tmp_path / "data")
    all_keys = write_dataset(data)
    for f in sorted(os.listdir(data)):
        s3.upload_file(os.path.join(data, f), bucket, f"data/{f}")
    url = f"s3://{bucket}/data"
    assert strata.index_dataset(url) == SAMPLES
    script = tmp_path / "train.py"
    script.write_text(TRAIN)

    rng = random.Random(20240601)
    # Four kills at increasing steps (each run resumes at or before its predecessor's kill, so each gets further),
    # two of them right after a save was started: the kill lands while that save is being written or uploaded.
    saves = [s for s in range(EVERY, STEPS - EVERY, EVERY)]
    others = [s for s in range(2, STEPS - 2) if s % EVERY]
    kills = sorted(rng.sample(saves, 2) + rng.sample(others, 2))

    local, remote = str(tmp_path / "nvme"), f"s3://{bucket}/ckpt"
    log = tmp_path / "steps.jsonl"
    final = tmp_path / "final.pt"
    args = [url, str(log), local, remote, str(final)]
    t0 = time.time()
    for k in kills:
        rc = run_trainer(script, args, k, str(tmp_path))
        assert rc == -signal.SIGKILL, f"the run to be killed at step {k} exited with {rc}: " + \
            (tmp_path / "trainer.out").read_text()[-3000:]
    rc = run_trainer(script, args, -1, str(tmp_path))
    assert rc == 0, (tmp_path / "trainer.out").read_text()[-3000:]
    killed_s = time.time() - t0

    # The uninterrupted reference: same seeds, its own tiers.
    ref_local, ref_remote = str(tmp_path / "ref-nvme"), f"s3://{bucket}/ref-ckpt"
    ref_log, ref_final = tmp_path / "ref.jsonl", tmp_path / "ref.pt"
    rc = run_trainer(script, [url, str(ref_log), ref_local, ref_remote, str(ref_final)], -1, str(tmp_path))
    assert rc == 0, (tmp_path / "trainer.out").read_text()[-3000:]

    runs = read_log(log)
    assert [r["kill"] for r in runs] == kills + [-1]
    assert runs[0]["start"] == 0
    (ref,) = read_log(ref_log)
    assert ref["order"] == list(range(1, STEPS + 1))

    # (a) Exactly once. Run i's steps up to the step run i+1 resumed from are committed; the ones after it were
    # lost with the process and replayed.
    committed = []  # (step, ids) in the order they count
    for i, r in enumerate(runs):
        assert r["order"] == list(range(r["start"] + 1, r["order"][-1] + 1)), "steps are consecutive"
        if i + 1 < len(runs):
            assert r["order"][-1] == r["kill"] and r["killing"]["killing"] == r["kill"]
            resumed = runs[i + 1]["start"]
            # It resumes from a checkpoint this run saved or an older one, never beyond its last step, and never
            # before a save this run saw `done` (durable in both tiers).
            assert resumed % EVERY == 0 and resumed <= r["kill"], (i, resumed, r["kill"])
            done = [int(s) for s, state in r["killing"]["handles"].items() if state == "done"]
            assert resumed >= max(done, default=0), (i, resumed, r["killing"]["handles"])
            assert resumed >= r["start"], "a run resumed before its predecessor's start: a checkpoint was lost"
            upto = resumed
        else:
            assert r["order"][-1] == STEPS and r["finished"]["finished"] == STEPS
            upto = STEPS
        committed += [(s, r["steps"][s]) for s in r["order"] if s <= upto]
        # A replayed step consumed the very samples of its first attempt: the order does not depend on the
        # process, its workers or timing.
        for s in r["order"]:
            for earlier in runs[:i]:
                if s in earlier["steps"]:
                    assert earlier["steps"][s] == r["steps"][s], f"step {s} consumed other samples on replay"
    assert [s for s, _ in committed] == list(range(1, STEPS + 1)), "every step committed exactly once"
    consumed = [k for _, ids in committed for k in ids]
    counts = collections.Counter(consumed)
    repeated = {k: c for k, c in counts.items() if c > 1}
    missing = set(all_keys) - set(counts)
    assert not repeated and not missing, (repeated, sorted(missing)[:20])
    assert len(consumed) == SAMPLES
    # ... and they are the samples of the uninterrupted run, step by step.
    assert [ids for _, ids in committed] == [ref["steps"][s] for s in range(1, STEPS + 1)]

    # (b) Every step committed locally is committed in the object store. A restarted Checkpointer uploads the
    # steps its predecessor left local only in a background thread (the final run joined its own); one more
    # restart here finishes anything still left, then the store is listed.
    after = strata.Checkpointer(RUN, local, remote, rank=0, world_size=1, agent="", keep_local=0)
    after.pending_uploads.join(timeout=120)
    assert not after.pending_uploads.is_alive(), "pending uploads did not finish within 120 s"
    on_disk = local_steps(local)
    in_store = remote_steps(s3, bucket, "ckpt")
    assert on_disk <= in_store, f"committed locally, never uploaded: {sorted(on_disk - in_store)}"
    # Every save step is committed in the end (a save lost with its process is saved again on replay), and
    # nothing else; a step whose process died before its manifest was never a checkpoint, so the pending
    # uploads leave it alone and the replay saves it whole.
    assert in_store == set(range(EVERY, STEPS + 1, EVERY)), sorted(in_store)
    assert on_disk == in_store, sorted(on_disk ^ in_store)
    # The store's copies are complete and verified, and hold what the local tier holds: a node with no local
    # tier restores every one of them.
    elsewhere = strata.Checkpointer(RUN, str(tmp_path / "other-node"), remote, rank=0, world_size=1, agent="")
    assert set(elsewhere.steps()) == in_store
    for s in sorted(in_store):
        st = elsewhere.load(s)
        assert st["step"] == s and st["loader"]["sample_in_epoch"] == s * BATCH, s
        if s in on_disk:
            mine = after.load(s)
            assert all(torch.equal(st["model"][k], mine["model"][k]) for k in mine["model"]), s
    step, st = elsewhere.load_latest()
    assert step == STEPS and st["step"] == STEPS

    # (c) The same model, bit for bit, as the uninterrupted run: checkpoints hold the exact float32 parameters
    # and momentum buffers, the samples of every step are the same, and the loop runs on one thread.
    got, want = torch.load(final), torch.load(ref_final)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), (k, got[k], want[k])
        assert torch.equal(st["model"][k], want[k]), k
    # No save failed: not even the replay of a step its predecessor left half-committed (its pending uploads
    # once committed that copy in the store, and the replay's save then failed).
    failed = {(i, s) for i, r in enumerate(runs) for s, state in r.get("killing", r.get("finished", {}))
              .get("handles", {}).items() if state == "failed"}
    assert not failed, sorted(failed)
    print(f"\nkills at {kills}; resumed at {[r['start'] for r in runs[1:]]}; killed runs + final: {killed_s:.1f}s; "
          f"steps in S3: {len(in_store)}, local: {len(on_disk)}; failed saves (run, step): {sorted(failed)}")


# ---------------------------------------------------------------------------------------------------------------
# Objects overwritten at the origin while readers stream them through the gateway


CHUNK = 4096
OBJECTS = {"small": 64 << 10, "mid": 5 << 20, "big": 20 << 20}  # the gateway's blocks are 1 MiB
PART = 8 << 20
OVERWRITE_SECONDS = 15


def version_body(name, v):
    """Version `v` of object `name`: every 4 KiB chunk says which object, version and chunk it is; the size
    changes from version to version too."""
    size = OBJECTS[name] + (v % 4) * 1000
    fill = bytes([ord("a") + v % 26])
    chunks = []
    for c in range(-(-size // CHUNK)):
        head = f"{name}:v{v:08d}:c{c:08d}:".encode()
        chunks.append(head + fill * (CHUNK - len(head)))
    return b"".join(chunks)[:size]


def multipart_etag(data):
    import hashlib

    digests = [hashlib.md5(data[o:o + PART]).digest() for o in range(0, len(data), PART)]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def put_at_origin(s3, key, data):
    """A multipart upload, so that the origin's ETag is fixed when the object appears (moto computes a plain
    PUT's ETag lazily, unlocked, and a GET racing that computation leaves it wrong: md5 of the first 16 MiB)."""
    up = s3.create_multipart_upload(Bucket="gw-origin", Key=key)["UploadId"]
    parts = []
    for i, o in enumerate(range(0, len(data), PART), 1):
        e = s3.upload_part(Bucket="gw-origin", Key=key, UploadId=up, PartNumber=i, Body=data[o:o + PART])["ETag"]
        parts.append({"PartNumber": i, "ETag": e})
    s3.complete_multipart_upload(Bucket="gw-origin", Key=key, UploadId=up, MultipartUpload={"Parts": parts})


def versions_in(name, data):
    """The versions named by the chunk headers of a body (more than one: a mixed body)."""
    out = set()
    prefix = f"{name}:v".encode()
    for o in range(0, len(data), CHUNK):
        if data[o:o + len(prefix)] == prefix:
            try:
                out.add(int(data[o + len(prefix):o + len(prefix) + 8]))
            except ValueError:
                out.add("?")
        else:
            out.add("?")
    return out


def get_through(s3, key, name, expected):
    """GET `key` through the gateway and check the body: (version, None) or (None, failure)."""
    try:
        r = s3.get_object(Bucket="origin", Key=key)
    except (ClientError, BotoCoreError) as e:
        status = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        return None, {"object": name, "where": "before headers", "status": status, "code": code, "error": repr(e)}
    declared, etag = r["ContentLength"], r["ETag"].strip('"')
    got, parts = 0, []
    try:
        for chunk in r["Body"].iter_chunks(1 << 20):
            parts.append(chunk)
            got += len(chunk)
    except Exception as e:  # cut short after the headers went out
        return None, {"object": name, "where": "mid-stream", "offset": got, "content_length": declared,
                      "etag": etag, "error": repr(e)}
    data = b"".join(parts)
    found = versions_in(name, data[:CHUNK])
    v = next(iter(found)) if len(found) == 1 else None
    want = expected.get(v) if isinstance(v, int) else None
    problem = None
    if want is None:
        problem = "unknown version"
    elif len(data) != declared:
        problem = "body length differs from Content-Length"
    elif declared != want[0]:
        problem = "Content-Length of another version"
    elif data != version_body(name, v):
        problem = "body is not one complete version"
    elif etag != want[1]:
        problem = "ETag of another version"
    if problem:
        return None, {"object": name, "where": "body", "problem": problem, "length": len(data),
                      "content_length": declared, "etag": etag, "versions": sorted(map(str, versions_in(name, data)))}
    return v, None


@pytest.fixture()
def fresh_gateway(origin):
    """The gateway fixture's agent (same origin bucket, keys, block size), with a metadata TTL short enough
    for an origin overwrite to be seen within a second (the fixture's is the default 60 s: in 15 s its readers
    would see one version per object), and RAM for every version written."""
    from conftest import Gateway

    g = Gateway(origin)
    g.stop()
    cfg = open(g.cfg).read()
    assert 'ram_capacity = "64MiB"' in cfg
    cfg = cfg.replace('ram_capacity = "64MiB"', 'ram_capacity = "2GiB"\nmetadata_ttl_ms = 300', 1)
    open(g.cfg, "w").write(cfg)
    g.start()
    yield g
    g.close()


def backend_get_errors(gw):
    from conftest import api_get

    total = 0.0
    for line in api_get(gw.api + "/metrics").read().decode().splitlines():
        if line.startswith("strata_io_requests_total") and 'op="get"' in line and 'tier="backend"' in line \
                and 'outcome="error"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def stale_metadata_reads_are_served_the_new_version(gateway, origin_s3, prefix):
    """With the fixture's gateway (metadata trusted 60 s): a HEAD caches a version's metadata but none of its
    blocks; the object is then overwritten at the origin. A GET within the TTL opens the old version, its first
    block's fill finds the change before any header is sent, and it must be served the new version, whole
    (a ranged GET from the middle of the object likewise); every read after it opens the new version."""
    s3 = gateway.client()
    refused_before = backend_get_errors(gateway)
    for name in OBJECTS:
        for ranged in (False, True) if OBJECTS[name] > (1 << 20) else (False,):
            key = f"{prefix}/{name}-{'range' if ranged else 'whole'}"
            expected = {}
            for v in (0, 1):
                data = version_body(name, v)
                expected[v] = (len(data), multipart_etag(data))
                put_at_origin(origin_s3, key, data)
                if v == 0:
                    h = s3.head_object(Bucket="origin", Key=key)  # version 0's metadata, none of its blocks
                    assert (h["ContentLength"], h["ETag"].strip('"')) == expected[0]
            if ranged:
                lo, hi = 2 * (1 << 20) + 100, 3 * (1 << 20) + 5000
                r = s3.get_object(Bucket="origin", Key=key, Range=f"bytes={lo}-{hi}")
                got = r["Body"].read()
                assert r["ContentRange"] == f"bytes {lo}-{hi}/{len(data)}", (name, r["ContentRange"])
                assert got == data[lo:hi + 1] and r["ETag"].strip('"') == expected[1][1], name
            else:
                v, failure = get_through(s3, key, name, expected)
                assert failure is None and v == 1, (name, v, failure)
            h = s3.head_object(Bucket="origin", Key=key)
            assert (h["ContentLength"], h["ETag"].strip('"')) == expected[1], (name, ranged)
    # The fills of version 0 were refused by the origin (If-Match): the path above was taken, not a lookup of
    # the new version by chance (the HEADs were well within the fixture's 60 s TTL).
    assert backend_get_errors(gateway) > refused_before, "no fill of a stale version was refused"


def test_origin_overwrites_under_concurrent_readers_never_fail_or_mix_versions(origin, gateway, fresh_gateway):
    """Objects of 64 KiB, 5 MiB and 20 MiB (1, 6 and 21 blocks) are overwritten at the origin, bypassing the
    gateway, for 15 s, while 4 threads GET them through the gateway without pause. Each version is read whole
    through the gateway before its object is overwritten again, so the version a GET may be streaming always
    has its blocks cached (RAM holds every version): then no GET may fail, before its headers or after, and
    every body is one complete version under that version's Content-Length and ETag.

    First, deterministically, the rule for a GET that finds the change before its headers went out: it is
    served the new version (`stale_metadata_reads_are_served_the_new_version`)."""
    origin_s3 = client(origin, ORIGIN_KEY, ORIGIN_SECRET)
    stale_metadata_reads_are_served_the_new_version(gateway, origin_s3, f"stale-{random.randrange(1 << 30)}")
    gw = fresh_gateway
    prefix = f"overwrite-{random.randrange(1 << 30)}"
    expected = {name: {} for name in OBJECTS}  # name -> version -> (size, etag), set before the version is PUT
    current = {}

    def publish(name, v):
        data = version_body(name, v)
        expected[name][v] = (len(data), multipart_etag(data))
        put_at_origin(origin_s3, f"{prefix}/{name}", data)
        current[name] = v

    for name in OBJECTS:
        publish(name, 0)

    stop = threading.Event()
    lock = threading.Lock()
    failures, gets = [], collections.Counter()
    seen = {name: collections.Counter() for name in OBJECTS}
    stale, regressions = collections.Counter(), collections.Counter()

    def reader(i):
        s3 = gw.client()
        rng = random.Random(i)
        last = {}
        while not stop.is_set():
            name = rng.choice(list(OBJECTS))
            at_start = current[name]
            v, failure = get_through(s3, f"{prefix}/{name}", name, expected[name])
            with lock:
                gets[name] += 1
                if failure is not None:
                    failure["reader"] = i
                    failure["origin_version_at_start"] = at_start
                    failures.append(failure)
                    continue
                seen[name][v] += 1
                stale[name] += v < at_start  # allowed: the metadata TTL
                regressions[name] += v < last.get(name, -1)
                last[name] = v

    readers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(4)]
    for t in readers:
        t.start()
    writer_s3 = gw.client()
    writes = collections.Counter()
    t0 = time.time()
    deadline = t0 + 180
    try:
        # Overwrite for OVERWRITE_SECONDS, and on until the readers saw at least 3 versions of every object
        # (bounded by a generous deadline, not asserted on time).
        while time.time() < deadline and (time.time() - t0 < OVERWRITE_SECONDS
                                          or min(len(seen[n]) for n in OBJECTS) < 3):
            for name in OBJECTS:
                v = current[name] + 1
                publish(name, v)
                writes[name] += 1
                # Read the new version whole through the gateway (once the TTL or a refresh lets it see it)
                # before the next overwrite: its blocks are then cached for whoever streams it later.
                while time.time() < deadline:
                    got, failure = get_through(writer_s3, f"{prefix}/{name}", name, expected[name])
                    if failure is not None:
                        failure["reader"] = "writer"
                        with lock:
                            failures.append(failure)
                    if got == v:
                        break
                    time.sleep(0.05)
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=120)
    elapsed = time.time() - t0
    # stale_but_whole: GETs served a version older than the origin's when they were sent (allowed: the TTL);
    # regressions: a reader served an older version than its previous GET of the object was (reported only).
    summary = {"gets": dict(gets), "writes": dict(writes),
               "distinct_versions_seen": {n: len(seen[n]) for n in OBJECTS}, "stale_but_whole": dict(stale),
               "regressions": dict(regressions), "seconds": round(elapsed, 1)}
    print(f"\n{summary}")
    assert not any(t.is_alive() for t in readers), "a reader is stuck"
    assert not failures, f"{len(failures)} failed or bad GETs of {sum(gets.values())}: {failures[:20]} {summary}"
    assert min(len(seen[n]) for n in OBJECTS) >= 3, summary
