"""The streaming loader and the `strata` Python package, against shards written by the real webdataset and
mosaicml-streaming packages, from a local directory, a real S3 server (moto) and through `strata serve`.
"""
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from conftest import Gateway, api_get  # noqa: E402
import numpy as np
import pytest

strata = pytest.importorskip("strata")
wds = pytest.importorskip("webdataset")
streaming = pytest.importorskip("streaming")


HERE = os.path.dirname(os.path.abspath(__file__))


def write_wds(d, n, per_shard, seed=0):
    os.makedirs(d, exist_ok=True)
    rng = random.Random(seed)
    with wds.ShardWriter(os.path.join(d, "shard-%05d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            sink.write({
                "__key__": f"sample{i:06d}",
                "txt": f"caption {i}".encode(),
                "cls": str(i % 10).encode(),
                "jpg": rng.randbytes(rng.randint(0, 3000)),
            })
    return d


@pytest.fixture(scope="module")
def wds_dir(tmp_path_factory):
    return write_wds(str(tmp_path_factory.mktemp("wds")), 240, 37)


MDS_COLUMNS = {"x": "bytes", "y": "int", "s": "str", "a": "ndarray:float32:2,3", "b": "ndarray", "j": "json",
               "f": "float32", "u": "uint16", "p": "pkl", "d": "float64"}


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("mds"))
    with streaming.MDSWriter(out=d, columns=MDS_COLUMNS, size_limit=8192) as w:
        for i in range(150):
            w.write({"x": bytes([i % 256]) * (i * 7), "y": i * 1000 - 70000, "s": f"text {i} ü",
                     "a": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
                     "b": np.arange(i + 1, dtype=np.int64).reshape(1, -1),
                     "j": {"i": i, "tags": ["a", "b"]}, "f": i / 4, "u": i, "p": {"obj": i}, "d": i * 1.5})
    return d


def keys(samples):
    return [s["__key__"] for s in samples]


def _is_utf8(b):
    try:
        b.decode()
        return True
    except UnicodeDecodeError:
        return False


def same_value(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b)) and np.asarray(a).dtype == np.asarray(b).dtype
    return a == b


# ---------------------------------------------------------------------------------------------------------------
# Formats read back identically


def test_webdataset_shards_read_back_identically(wds_dir):
    shards = sorted(os.path.join(wds_dir, f) for f in os.listdir(wds_dir))
    ref = list(wds.WebDataset(shards, shardshuffle=False, empty_check=False))
    got = list(strata.StreamingDataset(wds_dir))
    assert len(got) == len(ref) == 240
    for r, g in zip(ref, got):
        assert g["__key__"] == r["__key__"]
        fields = {k: v for k, v in r.items() if not k.startswith("__")}
        assert {k: v for k, v in g.items() if k != "__key__"} == fields


def test_mds_shards_read_back_identically(mds_dir):
    import pickle

    ref = streaming.LocalDataset(local=mds_dir)
    got = list(strata.StreamingDataset(mds_dir))
    assert len(got) == ref.num_samples == 150
    assert len(json.load(open(os.path.join(mds_dir, "index.json")))["shards"]) > 3
    for i, g in enumerate(got):
        r = ref[i]
        for col in MDS_COLUMNS:
            want = r[col]
            have = g[col]
            if col == "p":  # pickles stay bytes: the loader never unpickles
                assert pickle.loads(have) == want
            else:
                assert same_value(have, want), (i, col, have, want)


def test_manifest_index_gives_the_same_samples(tmp_path, wds_dir, mds_dir):
    for src in (wds_dir, mds_dir):
        d = str(tmp_path / os.path.basename(src))
        shutil.copytree(src, d)
        before = list(strata.StreamingDataset(d))
        n = strata.index_dataset(d)
        assert n == len(before)
        ds = strata.StreamingDataset(d)
        assert ds._native.index_origin == "strata-manifest.json"
        after = list(ds)
        assert keys(after) == keys(before)
        assert all(same_value(a[k], b[k]) for a, b in zip(after, before) for k in a)


# ---------------------------------------------------------------------------------------------------------------
# Order: deterministic, exactly once, independent of the partition


def consume(ds, epoch, start, rank, world, worker, workers, batch):
    return keys(ds._native.iter(epoch, start, rank, world, worker, workers, batch))


def rank_stream(ds, epoch, start, rank, world, workers, batch):
    """What a DataLoader with `workers` workers hands rank `rank`: batches from each worker in turn."""
    per_worker = [consume(ds, epoch, start, rank, world, w, workers, batch) for w in range(workers)]
    out, i = [], 0
    while any(per_worker):
        w = i % workers
        out.extend(per_worker[w][:batch])
        per_worker[w] = per_worker[w][batch:]
        i += 1
    return out


def test_exactly_once_over_three_epochs_2_nodes_2_ranks_2_workers(wds_dir):
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=17, shuffle_window=50)
    everything = sorted(keys(strata.StreamingDataset(wds_dir)))
    orders = []
    for epoch in range(3):
        seen = []
        for node in range(2):
            for local_rank in range(2):
                rank = node * 2 + local_rank
                for worker in range(2):
                    seen += consume(ds, epoch, 0, rank, 4, worker, 2, 8)
        assert sorted(seen) == everything  # 240 divides by 4: nothing dropped, nothing twice
        # The global order is the same whatever the partition.
        global_order = [ds.locate(p, epoch) for p in range(240)]
        orders.append(global_order)
        r0 = rank_stream(ds, epoch, 0, 0, 4, 2, 8)
        assert r0 == rank_stream(ds, epoch, 0, 0, 4, 3, 8) == rank_stream(ds, epoch, 0, 0, 4, 1, 8)
    assert orders[0] != orders[1] != orders[2]
    again = strata.StreamingDataset(wds_dir, shuffle=True, seed=17, shuffle_window=50)
    assert [again.locate(p, 1) for p in range(240)] == orders[1]
    other_seed = strata.StreamingDataset(wds_dir, shuffle=True, seed=18, shuffle_window=50)
    assert [other_seed.locate(p, 1) for p in range(240)] != orders[1]


def test_torch_dataloader_workers_deliver_the_in_process_order(wds_dir):
    torch = pytest.importorskip("torch")
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=5, batch_size=6, rank=1, world_size=2)
    in_process = keys(ds)
    for workers in (2, 3):
        dl = torch.utils.data.DataLoader(ds, batch_size=6, num_workers=workers, collate_fn=lambda b: b)
        assert [s["__key__"] for batch in dl for s in batch] == in_process
    assert len(in_process) == len(ds) == 120


def test_tail_policies(tmp_path):
    d = write_wds(str(tmp_path / "odd"), 230, 40)
    for tail, per_rank in (("drop", 57), ("pad", 58)):
        ds = strata.StreamingDataset(d, shuffle=True, seed=1, tail=tail, world_size=4, rank=0)
        assert len(ds) == per_rank
        seen = []
        for rank in range(4):
            seen += consume(ds, 0, 0, rank, 4, 0, 1, 1)
        assert len(seen) == per_rank * 4
        counts = collections.Counter(seen)
        if tail == "drop":
            assert len(counts) == 228 and max(counts.values()) == 1
        else:
            assert len(counts) == 230 and sum(c - 1 for c in counts.values()) == 2


def test_resume_with_a_different_world_size_in_process(wds_dir):
    rng = random.Random(11)
    for _ in range(5):
        world, batch = rng.choice([(4, 4), (2, 8), (3, 5)])
        ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=3, batch_size=batch, world_size=world, rank=0)
        steps = rng.randint(0, len(ds) // batch)
        consumed = []
        for rank in range(world):
            consumed += rank_stream(ds, 0, 0, rank, world, 2, batch)[: steps * batch]
        state = ds.state_dict(consumed=steps * batch)
        new_world, new_batch, new_workers = rng.choice([(1, 3, 1), (3, 2, 2), (5, 4, 3)])
        ds2 = strata.StreamingDataset(wds_dir, shuffle=True, seed=3, batch_size=new_batch,
                                      world_size=new_world, rank=0)
        ds2.load_state_dict(state)
        rest = []
        for rank in range(new_world):
            rest += rank_stream(ds2, 0, state["sample_in_epoch"], rank, new_world, new_workers, new_batch)
        allk = consumed + rest
        assert len(set(allk)) == len(allk), "a sample was delivered twice"
        remaining = 240 - state["sample_in_epoch"]
        assert 240 - len(allk) == remaining % new_world  # only the uneven tail is dropped


KILL_SCRIPT = r"""
import json, os, sys
import torch
import strata
url, out, state_path, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ds = strata.StreamingDataset(url, shuffle=True, seed=23, shuffle_window=64, batch_size=batch)
if os.path.exists(state_path):
    ds.load_state_dict(json.load(open(state_path)))
dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=2, collate_fn=lambda b: b)
with open(out, "a") as f:
    for step, b in enumerate(dl):
        # One "training step": record what was consumed and the state after it, durably.
        f.write(json.dumps({"keys": [s["__key__"] for s in b],
                            "state": ds.state_dict(consumed=(step + 1) * batch)}) + "\n")
        f.flush()
        os.fsync(f.fileno())
        # The test's kill lands here: a long step, so that a fast machine cannot finish the epoch first.
        if step + 1 == int(os.environ.get("STOP_AFTER", "0")):
            import time
            time.sleep(600)
"""


def test_sigkill_then_resume_with_a_different_world_size(tmp_path, wds_dir):
    """A real training loop (torch DataLoader, 2 workers) is SIGKILLed mid-epoch; two ranks resume from the last
    recorded state: every sample of the epoch is consumed exactly once."""
    script = tmp_path / "train.py"
    script.write_text(KILL_SCRIPT)
    log = tmp_path / "rank0.jsonl"
    kill_after = random.Random(7).randint(8, 40)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", STOP_AFTER=str(kill_after))
    p = subprocess.Popen([sys.executable, str(script), wds_dir, str(log), str(tmp_path / "none"), "4"], env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= kill_after or p.poll() is not None:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    records = [json.loads(l) for l in log.read_text().splitlines() if l.endswith("}")]
    assert 0 < len(records) < 60, "the kill should land mid-epoch"
    before = [k for r in records for k in r["keys"]]
    state_path = tmp_path / "state.json"
    state_path.write_text(json.dumps(records[-1]["state"]))
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, str(script), wds_dir, str(tmp_path / f"r{rank}.jsonl"),
                                       str(state_path), "3"], env=env))
    for p in procs:
        assert p.wait(timeout=120) == 0
    after = [k for rank in range(2) for l in (tmp_path / f"r{rank}.jsonl").read_text().splitlines()
             for k in json.loads(l)["keys"]]
    allk = before + after
    assert len(set(allk)) == len(allk)
    assert 240 - len(allk) == (240 - records[-1]["state"]["sample_in_epoch"]) % 2


def test_resume_state_is_checked(wds_dir):
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=1)
    st = ds.state_dict(consumed=10)
    other = strata.StreamingDataset(wds_dir, shuffle=True, seed=2)
    with pytest.raises(strata.InvalidInputError, match="seed"):
        other.load_state_dict(st)
    st["sample_in_epoch"] = 10_000
    with pytest.raises(strata.InvalidInputError):
        ds.load_state_dict(st)


# ---------------------------------------------------------------------------------------------------------------
# Object storage and the node agent


def upload_dir(s3, bucket, prefix, d):
    for f in sorted(os.listdir(d)):
        s3.upload_file(os.path.join(d, f), bucket, f"{prefix}/{f}")


def test_stream_from_s3_same_as_local(s3_env, wds_dir, mds_dir):
    upload_dir(s3_env, "direct", "loader/wds", wds_dir)
    upload_dir(s3_env, "direct", "loader/mds", mds_dir)
    for local, url in ((wds_dir, "s3://direct/loader/wds"), (mds_dir, "s3://direct/loader/mds")):
        want = list(strata.StreamingDataset(local, shuffle=True, seed=4))
        got = list(strata.StreamingDataset(url, shuffle=True, seed=4, cache="local"))
        assert keys(got) == keys(want)
        assert all(same_value(a[k], b[k]) for a, b in zip(got, want) for k in a)


def agent_metric(api, name, labels=""):
    base = api if "://" in api else f"http://{api}"
    text = api_get(f"{base}/metrics").read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_ranks_share_the_agent_cache(s3_env, origin, tmp_path):
    d = write_wds(str(tmp_path / "agentds"), 300, 60, seed=3)
    upload_dir(s3_env, "gw-origin", "loader/agentds", d)
    # Indexed where it lives: the manifest records the S3 ETags.
    assert strata.index_dataset("s3://gw-origin/loader/agentds") == 300
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".tar"))
    # An agent of its own: the session's agent still finishes other tests' read-ahead and prefetches in the
    # background, and its origin counter would count them here.
    agent = Gateway(origin)
    try:
        want = keys(strata.StreamingDataset(d, shuffle=True, seed=9))
        got = []
        for rank in range(2):  # two ranks of one node, each reading the whole epoch (world 1)
            ds = strata.StreamingDataset("s3://gw-origin/loader/agentds", shuffle=True, seed=9, agent=agent.api,
                                         cache="agent", rank=0, world_size=1)
            assert ds.source_kind == "agent"
            got.append(keys(ds))
        assert got[0] == got[1] == want
        fetched = agent_metric(agent.api, "strata_io_bytes_total", 'op="get",tier="backend"')
    finally:
        agent.close()
    # Every shard byte came from the origin once for the node (blocks are 1 MiB; the manifest is tiny).
    assert size <= fetched <= size + (1 << 20), (fetched, size)


def test_zero_copy_samples_from_the_agent_cross_workers_in_shared_memory(s3_env, gateway, tmp_path):
    torch = pytest.importorskip("torch")
    import gc

    d = write_wds(str(tmp_path / "agentzc"), 120, 30, seed=5)
    upload_dir(s3_env, "gw-origin", "loader/agentzc", d)
    want = {s["__key__"]: s for s in strata.StreamingDataset(d)}
    ds = strata.StreamingDataset("s3://gw-origin/loader/agentzc", shuffle=True, seed=1, agent=gateway.api,
                                 cache="agent", batch_size=3, zero_copy=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=lambda b: b)
    got = [s for batch in dl for s in batch]
    assert sorted(x["__key__"] for x in got) == sorted(want)
    for x in got:
        for k, v in x.items():
            if k != "__key__":
                assert v == want[x["__key__"]][k], k
                if len(v) > 0:
                    assert isinstance(v, strata.Buffer), type(v)
    assert ds.shared_memory_in_use > 0
    del got, x, v
    gc.collect()
    assert ds.shared_memory_in_use == 0


# ---------------------------------------------------------------------------------------------------------------
# Bad input: clear errors naming the shard, nothing silently wrong


def test_missing_dataset_and_missing_index(tmp_path):
    with pytest.raises(strata.NotFoundError):
        strata.StreamingDataset(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(strata.NotFoundError, match="no strata-manifest.json"):
        strata.StreamingDataset(str(tmp_path / "empty"))


def test_corrupt_tar_header_names_the_shard(tmp_path, wds_dir):
    d = tmp_path / "c"
    shutil.copytree(wds_dir, d)
    shard = d / "shard-00002.tar"
    b = bytearray(shard.read_bytes())
    b[0] ^= 0x55  # the first header's name: its checksum no longer matches
    shard.write_bytes(bytes(b))
    with pytest.raises(strata.CorruptDataError, match="shard-00002.tar.*checksum"):
        strata.StreamingDataset(str(d))


def _member_offsets(data):
    """The offset of every member header of a tar."""
    off, out = 0, []
    while off + 512 <= len(data) and any(data[off:off + 512]):
        size = int(data[off + 124:off + 136].strip(b"\0 ") or b"0", 8)
        out.append(off)
        off += 512 + (size + 511) // 512 * 512
    return out


def test_a_shard_cut_between_members_or_empty_is_an_error_never_fewer_samples(tmp_path, wds_dir):
    """Cut at a block boundary between two fields of a sample, a tar has only whole blocks: without its
    end-of-archive blocks it must still be refused, never read as fewer samples, one of them short a field."""
    torch = pytest.importorskip("torch")
    d = tmp_path / "cut"
    shutil.copytree(wds_dir, d)
    shard = d / "shard-00001.tar"
    data = shard.read_bytes()
    heads = _member_offsets(data)
    shard.write_bytes(data[:heads[len(heads) // 2 + 1]])   # inside a sample, on a member boundary
    for workers in (0, 2):
        with pytest.raises(strata.CorruptDataError, match="shard-00001.tar.*cut short"):
            ds = strata.StreamingDataset(str(d), shuffle=False)
            list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers))
    shard.write_bytes(b"")
    with pytest.raises(strata.CorruptDataError, match="shard-00001.tar.*empty"):
        strata.StreamingDataset(str(d))


def test_truncated_shard_and_changed_shard_against_a_manifest(tmp_path, wds_dir):
    d = tmp_path / "t"
    shutil.copytree(wds_dir, d)
    strata.index_dataset(str(d))
    shard = d / "shard-00001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    ds = strata.StreamingDataset(str(d))
    with pytest.raises(strata.ChangedError, match="shard-00001.tar"):
        list(ds)
    # Same size, other bytes: the manifest offsets no longer match what is there.
    shard.write_bytes(data[1024:] + b"\0" * 1024)
    with pytest.raises((strata.CorruptDataError, strata.ChangedError), match="shard-00001.tar"):
        list(strata.StreamingDataset(str(d)))


def test_inconsistent_mds_index_names_the_shard(tmp_path, mds_dir):
    d = tmp_path / "m"
    shutil.copytree(mds_dir, d)
    idx = json.loads((d / "index.json").read_text())
    idx["shards"][1]["samples"] += 1
    (d / "index.json").write_text(json.dumps(idx))
    with pytest.raises(strata.CorruptDataError, match="shard.00001.mds.*index"):
        list(strata.StreamingDataset(str(d)))
    (d / "index.json").write_text("{not json")
    with pytest.raises(strata.CorruptDataError, match="index.json"):
        strata.StreamingDataset(str(d))


def test_skip_corrupt_is_opt_in_and_counted(tmp_path, wds_dir):
    d = tmp_path / "s"
    shutil.copytree(wds_dir, d)
    strata.index_dataset(str(d))
    m = json.loads((d / "strata-manifest.json").read_text())
    sh = m["shards"][0]
    bad = sh["offsets"][5]  # the first header of the sixth sample of shard 0
    shard = d / sh["key"]
    b = bytearray(shard.read_bytes())
    b[bad + 150] ^= 0x01  # its checksum field
    st = os.stat(shard)
    shard.write_bytes(bytes(b))
    # Bit rot: same size, same mtime (so the same local ETag); only that sample is damaged.
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(strata.CorruptDataError, match=sh["key"]):
        list(strata.StreamingDataset(str(d)))
    ds = strata.StreamingDataset(str(d), skip_corrupt=True)
    got = keys(ds)
    assert len(got) == 239 and "sample000005" not in got
    assert ds.stats()["skipped"] == 1


def test_cache_and_window_smaller_than_a_shard_do_not_deadlock(tmp_path):
    d = str(tmp_path / "big")
    os.makedirs(d)
    with wds.ShardWriter(os.path.join(d, "s-%03d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(30):
            sink.write({"__key__": f"k{i:03d}", "bin": bytes([i]) * 300_000})
    ds = strata.StreamingDataset(d, shuffle=True, seed=2, cache="local", cache_bytes=256 << 10,
                                 block_size=64 << 10, prefetch_bytes=100 << 10)
    got = list(ds)
    assert sorted(keys(got)) == [f"k{i:03d}" for i in range(30)]
    assert all(s["bin"] == bytes([int(s["__key__"][1:])]) * 300_000 for s in got)


def test_stall_time_is_reported_through_the_api_and_metrics(wds_dir):
    ds = strata.StreamingDataset(wds_dir, rank=0, world_size=1)
    n = sum(1 for _ in ds)
    st = ds.stats()
    assert st["samples"] == n == 240 and st["stall_seconds"] >= 0.0 and st["bytes"] > 0
    text = strata.metrics_text()
    assert 'strata_loader_samples_total{rank="0"}' in text
    assert "strata_loader_stall_seconds_total" in text


def test_bad_arguments_are_clear(wds_dir):
    with pytest.raises(strata.InvalidInputError, match="tail"):
        strata.StreamingDataset(wds_dir, tail="wrap")
    with pytest.raises(strata.InvalidInputError, match="rank"):
        strata.StreamingDataset(wds_dir, rank=3, world_size=2)
    with pytest.raises(strata.InvalidInputError, match="cache"):
        strata.StreamingDataset(wds_dir, cache="agent", agent=None)


def test_cli_dataset_index(tmp_path, mds_dir):
    from conftest import STRATA

    d = tmp_path / "cli"
    shutil.copytree(mds_dir, d)
    out = subprocess.run([STRATA, "dataset", "index", str(d)], capture_output=True, text=True, check=True).stdout
    assert "150 samples" in out
    m = json.loads((d / "strata-manifest.json").read_text())
    assert m["shard_format"] == "mds" and sum(s["samples"] for s in m["shards"]) == 150
    ds = strata.StreamingDataset(str(d))
    assert ds._native.index_origin == "strata-manifest.json" and len(list(ds)) == 150
    bad = subprocess.run([STRATA, "dataset", "index", str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode != 0 and "does not exist" in bad.stderr


def backend_get_bytes():
    total = 0.0
    for line in strata.metrics_text().splitlines():
        if line.startswith("strata_io_bytes_total") and 'op="get"' in line and 'tier="backend"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_dataloader_workers_share_the_rank_cache_across_epochs(s3_env, tmp_path):
    """Workers read through their rank's cache: each block is fetched from the origin once for the rank, and
    a second epoch (new worker processes) fetches nothing."""
    torch = pytest.importorskip("torch")
    d = write_wds(str(tmp_path / "shared"), 200, 40, seed=5)
    upload_dir(s3_env, "direct", "loader/shared", d)
    strata.index_dataset("s3://direct/loader/shared")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".tar"))
    ds = strata.StreamingDataset("s3://direct/loader/shared", shuffle=True, seed=3, batch_size=4, cache="local",
                                 block_size=256 << 10)
    want = sorted(keys(strata.StreamingDataset(d)))
    before = backend_get_bytes()
    for epoch in range(2):
        ds.set_epoch(epoch)
        dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b)
        got = [s["__key__"] for b in dl for s in b]
        assert sorted(got) == want
        fetched = backend_get_bytes() - before
        assert size <= fetched <= size + (256 << 10) * 5, (epoch, fetched, size)


def backend_gets():
    total = 0.0
    for line in strata.metrics_text().splitlines():
        if line.startswith("strata_io_requests_total") and 'op="get"' in line and 'tier="backend"' in line \
                and 'outcome="ok"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_shuffle_window_is_fetched_as_whole_shards(s3_env, tmp_path):
    """Entering a shuffle window that covers whole MDS shards, the rank asks for each shard (header included)
    with one request before any sample read, so DataLoader workers' random reads inside the window join those
    fetches instead of fetching block by block: one origin GET per shard (and the index) for a cold epoch."""
    torch = pytest.importorskip("torch")
    d = str(tmp_path / "mds-window")
    rng = np.random.default_rng(7)
    with streaming.MDSWriter(out=d, columns={"x": "bytes", "y": "int"}, size_limit=1 << 20) as w:
        for i in range(160):
            w.write({"x": rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes(), "y": i})
    shards = [f for f in os.listdir(d) if f.endswith(".mds")]
    assert len(shards) >= 3
    upload_dir(s3_env, "direct", "loader/window", d)
    before = backend_gets()
    ds = strata.StreamingDataset("s3://direct/loader/window", shuffle=True, seed=11, batch_size=4, cache="local",
                                 block_size=64 << 10)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: b)
    got = sorted(s["y"] for b in dl for s in b)
    assert got == list(range(160))
    gets = backend_gets() - before
    # 16 blocks of 64 KiB per shard: fetched one by one, that would be dozens of requests.
    assert gets <= len(shards) + 1, (gets, len(shards))


def test_zero_copy_samples_equal_the_copied_ones_and_behave_as_bytes(wds_dir, mds_dir):
    """zero_copy=True: binary fields are read-only Buffers over Strata's memory, equal to the bytes of the
    default mode, usable wherever a bytes-like object is, pickled as bytes, valid after the dataset is gone."""
    import gc
    import io
    import pickle

    for d in (wds_dir, mds_dir):
        plain = list(strata.StreamingDataset(d, shuffle=True, seed=4))
        zc = list(strata.StreamingDataset(d, shuffle=True, seed=4, zero_copy=True))
        assert len(plain) == len(zc) > 0
        for a, b in zip(plain, zc):
            assert a.keys() == b.keys()
            for k in a:
                assert same_value(a[k], b[k]), (d, k)
                if isinstance(a[k], bytes):
                    assert isinstance(b[k], strata.Buffer) and b[k] == a[k] and bytes(b[k]) == a[k]
    buf = next(x for s in zc for x in s.values() if isinstance(x, strata.Buffer) and len(x) > 8)
    want = bytes(buf)
    m = memoryview(buf)
    assert m.readonly and m.tobytes() == want and len(buf) == len(want)
    with pytest.raises(TypeError):
        m[0] = 1
    assert np.frombuffer(buf, dtype=np.uint8).tobytes() == want
    assert io.BytesIO(buf).read() == want
    back = pickle.loads(pickle.dumps(buf))
    assert type(back) is bytes and back == want
    # Indexing, slicing (a slice shares the memory), decode, as bytes do.
    assert buf[0] == want[0] and buf[-1] == want[-1] and buf[3:9] == want[3:9] and buf[::3] == want[::3]
    assert isinstance(buf[3:9], strata.Buffer) and buf[9:3] == b"" and buf[-4:] == want[-4:]
    with pytest.raises(IndexError):
        buf[len(want)]
    with pytest.raises(TypeError):
        buf["x"]
    wds_zc = list(strata.StreamingDataset(wds_dir, zero_copy=True))
    text = wds_zc[5]["txt"]
    assert text.decode() == bytes(text).decode() and text.decode("latin-1") == bytes(text).decode("latin-1")
    binary = next(s["jpg"] for s in wds_zc if not _is_utf8(bytes(s["jpg"])))
    with pytest.raises(UnicodeDecodeError):
        binary.decode()
    assert binary.decode("utf-8", "replace") == bytes(binary).decode("utf-8", "replace")
    del wds_zc, text, binary
    # The memory stays valid while a Buffer (or a view of it) lives, whatever happened to the dataset.
    del plain, zc
    gc.collect()
    assert m.tobytes() == want and bytes(buf) == want


def process_state(pid):
    """`/proc/PID/stat`'s name and state of a process, or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return "gone"
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return f"{name} {rest.split()[0]}"


def test_zero_copy_samples_cross_workers_in_shared_memory(wds_dir, mds_dir):
    """Through DataLoader workers, zero_copy samples arrive as Buffers over the shared region (handles in the
    queue, not pickled bytes), equal to the copying mode's; the region is empty again once they are dropped;
    an abandoned iteration and a region too small fall back to bytes without error."""
    torch = pytest.importorskip("torch")
    import gc
    import pickle

    from multiprocessing.reduction import ForkingPickler

    def by_key(samples):
        return {s["__key__"]: s for s in samples}

    for d in (wds_dir, mds_dir):
        want = by_key(strata.StreamingDataset(d, shuffle=True, seed=3))
        ds = strata.StreamingDataset(d, shuffle=True, seed=3, batch_size=2, zero_copy=True)
        dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda b: b)
        got = [s for batch in dl for s in batch]
        assert len(got) == len(want)
        shared = 0
        for s in got:
            w = want[s["__key__"]]
            assert s.keys() == w.keys()
            for k in s:
                assert same_value(s[k], w[k]), (d, k)
                if isinstance(w[k], bytes) and len(w[k]) > 0:
                    assert isinstance(s[k], strata.Buffer), (d, k, type(s[k]))
                    shared += 1
        assert shared > 0
        assert ds.shared_memory_in_use > 0, "held by the samples above"
        held = ds.shared_memory_held()
        assert sum(h["bytes"] for h in held) == ds.shared_memory_in_use
        assert all(h["adopted_refs"] > 0 and h["producer"] != os.getpid() for h in held), held
        # Plain pickle still writes bytes; the multiprocessing pickler a handle, adopted once.
        buf = next(x for s in got for x in s.values() if isinstance(x, strata.Buffer) and len(x) > 0)
        assert type(pickle.loads(pickle.dumps(buf))) is bytes
        message = bytes(ForkingPickler.dumps(buf))
        assert len(message) < 200, "a handle, not the bytes"
        again = pickle.loads(message)
        assert isinstance(again, strata.Buffer) and again == buf
        del got, buf, again, s  # the loop variable holds the last sample
        gc.collect()
        assert ds.shared_memory_in_use == 0, "every slot freed with the last sample"

    # Abandoned mid-epoch, again and again: the handles left in the queue and the reads in flight are reclaimed
    # once the workers have exited, and the next epoch still gets every sample in shared memory.
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=3, batch_size=2, zero_copy=True)
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda b: b)
    for _ in range(3):
        it = iter(dl)
        for i, batch in enumerate(it):
            if i == 3:
                break
        workers = [w.pid for w in it._workers]
        del it, batch
        gc.collect()
        # Reclaimed once the workers have exited: DataLoader's shutdown may return before a worker is reaped
        # (a zombie still counts as alive), so wait for that, not for a time.
        deadline = time.time() + 60
        while ds.shared_memory_in_use != 0 and time.time() < deadline:
            time.sleep(0.05)
        if ds.shared_memory_in_use != 0:
            held = ds.shared_memory_held()
            procs = {p: process_state(p) for p in {h["producer"] for h in held} | set(workers)}
            pytest.fail(f"not reclaimed after the abandoned iteration: {held}; workers {workers}; "
                        f"this process {os.getpid()}; processes {procs}")
    got = [s for batch in dl for s in batch]
    plain = by_key(strata.StreamingDataset(wds_dir))
    assert all(isinstance(s["jpg"], strata.Buffer) and s["jpg"] == plain[s["__key__"]]["jpg"]
               for s in got if len(plain[s["__key__"]]["jpg"]) > 0)
    full = [s["__key__"] for s in got]
    del got
    want_keys = [s["__key__"] for s in strata.StreamingDataset(wds_dir)]
    assert sorted(full) == sorted(want_keys)

    # A region smaller than one sample: every sample is pickled as bytes, nothing lost.
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=3, batch_size=2, zero_copy=True,
                                 shared_memory_bytes=16384)
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda b: b)
    got = [s for batch in dl for s in batch]
    assert sorted(s["__key__"] for s in got) == sorted(want_keys)
    assert all(isinstance(v, (bytes, strata.Buffer)) for s in got for k, v in s.items() if k != "__key__")


def test_copied_samples_cross_workers_in_shared_memory_too(wds_dir, mds_dir, tmp_path):
    """Without zero_copy, DataLoader workers' bytes fields cross the queue as handles as well, and the training
    process gets plain dicts of bytes copied out of shared memory, equal to the in-process ones, with a list
    collate and with default_collate; nothing is left held afterwards."""
    torch = pytest.importorskip("torch")
    import gc

    from multiprocessing.reduction import ForkingPickler

    def by_key(samples):
        return {s["__key__"]: s for s in samples}

    for d in (wds_dir, mds_dir):
        plain = list(strata.StreamingDataset(d, shuffle=True, seed=3))
        assert all(type(s) is dict for s in plain), "in-process samples are plain dicts"
        want = by_key(plain)
        for collate in ("list", "default"):
            if collate == "default" and d == mds_dir:
                continue  # default_collate turns MDS numbers into tensors; the list collate covers MDS
            ds = strata.StreamingDataset(d, shuffle=True, seed=3, batch_size=4)
            kw = {"collate_fn": (lambda b: b)} if collate == "list" else {}
            dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, **kw)
            got = []
            for batch in dl:
                if collate == "list":
                    got.extend(batch)
                else:
                    assert type(batch) is dict
                    got.extend({k: batch[k][i] for k in batch} for i in range(len(batch["__key__"])))
            assert sorted(s["__key__"] for s in got) == sorted(want)
            for s in got:
                assert type(s) is dict
                w = want[s["__key__"]]
                assert s.keys() == w.keys()
                for k in s:
                    assert type(s[k]) is type(w[k]) and same_value(s[k], w[k]), (d, collate, k)
            del got, batch
            gc.collect()
            assert ds.shared_memory_in_use == 0, (d, collate)

    # Unbatched (batch_size=None: torch rebuilds each mapping with default_convert): still equal dicts.
    ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=3)
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    want = by_key(strata.StreamingDataset(wds_dir, shuffle=True, seed=3))
    assert sorted(s["__key__"] for s in got) == sorted(want)
    assert all(s[k] == want[s["__key__"]][k] for s in got for k in s)
    del got
    gc.collect()
    assert ds.shared_memory_in_use == 0

    # What a worker sends is handles, not the bytes: 64 KiB samples, four to a batch, pickled in the worker
    # by the multiprocessing pickler (those handles are never adopted: reclaimed when the workers exit).
    big = str(tmp_path / "big")
    os.makedirs(big)
    with wds.ShardWriter(os.path.join(big, "shard-%05d.tar"), maxcount=8, verbose=0) as sink:
        for i in range(16):
            sink.write({"__key__": f"b{i:04d}", "bin": bytes([i]) * 65536})
    ds = strata.StreamingDataset(big, batch_size=4)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=2,
        collate_fn=lambda b: (sum(len(s["bin"]) for s in b), len(ForkingPickler.dumps(b))))
    sizes = list(dl)
    assert sizes and all(payload == 4 * 65536 and message < 2048 for payload, message in sizes), sizes
    del dl
    gc.collect()
    assert ds.shared_memory_in_use == 0, "the workers are gone: their unadopted handles were reclaimed"


def test_zero_copy_with_default_collate_in_process_and_through_workers(wds_dir):
    torch = pytest.importorskip("torch")
    want = sorted(keys(strata.StreamingDataset(wds_dir)))
    for workers in (0, 2):
        ds = strata.StreamingDataset(wds_dir, shuffle=True, seed=2, batch_size=4, zero_copy=True)
        dl = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers)  # default_collate
        got = []
        for batch in dl:
            field = next(k for k in batch if k != "__key__")
            kinds = {type(x) for x in batch[field]}
            assert kinds == {strata.Buffer}, kinds
            got.extend(batch["__key__"])
        assert sorted(got) == want


SHARE_THEN_HANG = r"""
import sys, time, torch, strata
ds = strata.StreamingDataset(sys.argv[1], shuffle=False, cache="local")
dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
it = iter(dl)
next(it)
print("serving", flush=True)
time.sleep(600)
"""


def test_a_killed_ranks_share_socket_is_swept_at_the_next_start(s3_env, tmp_path):
    """The share sockets live in this user's directory, named after their process; one left by a SIGKILLed
    rank is removed when the next rank starts its share."""
    torch = pytest.importorskip("torch")
    d = write_wds(str(tmp_path / "sock"), 40, 10, seed=9)
    upload_dir(s3_env, "direct", "loader/sock", d)
    url = "s3://direct/loader/sock"
    strata.index_dataset(url)
    p = subprocess.Popen([sys.executable, "-c", SHARE_THEN_HANG, url], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "serving"
        sock_dir = os.path.join(tempfile.gettempdir(), f"strata-loader-{os.getuid()}")
        mine = [f for f in os.listdir(sock_dir) if f.startswith(f"{p.pid}-")] if os.path.isdir(sock_dir) else []
        assert mine, f"no socket of {p.pid} in {sock_dir}"
        assert os.stat(sock_dir).st_mode & 0o777 == 0o700
    finally:
        p.kill()
        p.wait()
    assert os.path.exists(os.path.join(sock_dir, mine[0])), "left behind by the kill"
    ds = strata.StreamingDataset(url, shuffle=False, cache="local")
    assert len(list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))) == 40
    assert not os.path.exists(os.path.join(sock_dir, mine[0])), "the dead rank's socket was not swept"
