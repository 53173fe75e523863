"""The checkpointer from Python: torch and numpy state, the local tier and a real S3 server (moto), verified
restore with fallback, other world sizes, retention, failures reported but never raised, and SIGKILL of a
saving process in a loop."""
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from conftest import api_get  # noqa: E402
import numpy as np
import pytest

strata = pytest.importorskip("strata")
torch = pytest.importorskip("torch")



def model_state(step, n=1000):
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(n, 8, generator=g), "b": torch.arange(8, dtype=torch.bfloat16) + step,
                  "steps": torch.tensor([step], dtype=torch.int64)},
        "optimizer": {"state": {0: {"exp_avg": np.full(16, step, dtype=np.float32)}},
                      "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}]},
        "rng": b"\x01\x02" * step,
        "epoch": step // 10,
        "name": "resnet",
        "empty": torch.zeros(0),
    }


def same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.fixture()
def s3(s3_env):
    c = s3_env
    name = f"ckpt-{random.randrange(1 << 30)}"
    c.create_bucket(Bucket=name)
    return f"s3://{name}/runs"


def test_round_trip_and_mutation_after_save(tmp_path):
    c = strata.Checkpointer("run-a", str(tmp_path), rank=0, world_size=1)
    assert c.load_latest() is None
    state = model_state(5, n=200_000)  # 6 MiB: the save is still running when the state changes
    want = {k: v for k, v in model_state(5, n=200_000).items()}
    h = c.save(5, state)
    state["model"]["w"].add_(1.0)  # training goes on at once
    state["optimizer"]["state"][0]["exp_avg"][:] = -1
    assert h.wait() == "done" and h.error is None
    step, got = c.load_latest()
    assert step == 5 and same(got, want)
    assert c.steps() == [5]
    # Restored tensors are ordinary, writable memory; writing to them never changes the checkpoint (the local
    # shard is mapped copy-on-write).
    got["model"]["w"].add_(1.0)
    got["optimizer"]["state"][0]["exp_avg"][:] = 3
    assert same(c.load(5), want)
    assert c._native.local_verified(5) is not None


def test_shards_are_safetensors(tmp_path):
    from safetensors.torch import load_file

    c = strata.Checkpointer("run-st", str(tmp_path), rank=0, world_size=1)
    st = model_state(3)
    assert c.save(3, st).wait() == "done"
    (shard,) = glob.glob(str(tmp_path / "run-st" / "*" / "rank-00000.safetensors"))
    loaded = load_file(shard)
    assert torch.equal(loaded["model/w"], st["model"]["w"])
    assert torch.equal(loaded["model/b"], st["model"]["b"])
    manifest = json.load(open(os.path.join(os.path.dirname(shard), "manifest.json")))
    assert manifest["world_size"] == 1 and manifest["shards"][0]["file"] == "rank-00000.safetensors"


def test_object_store_tier_and_verified_fallback(tmp_path, s3):
    c = strata.Checkpointer("run-s3", str(tmp_path / "nvme"), s3, rank=0, world_size=1, upload_every=2,
                            keep_local=0, keep_remote=0)
    for step in (1, 2, 3):
        assert c.save(step, model_state(step)).wait() == "done"
    # Step 3 is local only (uploads: saves 1 and 3 -> steps 1, 3); corrupt its local shard: load(3) must fail over
    # to the object store copy, verified.
    (shard,) = glob.glob(str(tmp_path / "nvme" / "run-s3" / "*3" / "rank-00000.safetensors"))
    data = bytearray(open(shard, "rb").read())
    data[-1] ^= 0xFF
    open(shard, "wb").write(bytes(data))
    assert same(c.load(3), model_state(3))
    # A new node: no local tier at all. Step 3 and step 1 come from the object store; step 2 was never uploaded.
    shutil.rmtree(tmp_path / "nvme")
    fresh = strata.Checkpointer("run-s3", str(tmp_path / "nvme2"), s3, rank=0, world_size=1)
    assert fresh.steps() == [3, 1]
    step, got = fresh.load_latest()
    assert step == 3 and same(got, model_state(3))
    with pytest.raises(strata.NotFoundError):
        fresh.load(2)


SAVER = r"""
import os, sys, torch, strata
sys.path.insert(0, os.environ["TESTS_DIR"])
from test_checkpoint import model_state
c = strata.Checkpointer("run-mr", sys.argv[1], commit_timeout=60)
for step in (10, 20):
    st = model_state(step + int(os.environ["RANK"]))
    assert c.save(step, st).wait() == "done"
"""


def test_two_ranks_and_another_world_size(tmp_path):
    env = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", TESTS_DIR=os.path.dirname(__file__))
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], env=dict(env, RANK=str(r)))
             for r in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    for r in range(2):
        c = strata.Checkpointer("run-mr", str(tmp_path), rank=r, world_size=2)
        step, got = c.load_latest()
        assert step == 20 and same(got, model_state(20 + r))
    three = strata.Checkpointer("run-mr", str(tmp_path), rank=0, world_size=3)
    with pytest.raises(strata.InvalidInputError, match="2 ranks"):
        three.load_latest()


def test_retention_keeps_the_newest(tmp_path):
    c = strata.Checkpointer("run-ret", str(tmp_path), rank=0, world_size=1, keep_local=2, keep_every=30)
    for step in (10, 20, 30, 40, 50, 60):
        assert c.save(step, {"x": np.array([step])}).wait() == "done"
    assert c.steps() == [60, 50, 30]
    other = strata.Checkpointer("run-ret2", str(tmp_path), rank=0, world_size=1, keep_local=1)
    assert other.save(1, {"x": np.array([1])}).wait() == "done"
    assert c.steps() == [60, 50, 30]


def test_a_failing_save_is_reported_not_raised(tmp_path, s3_env):
    failed = []
    got = threading.Event()
    c = strata.Checkpointer("run-f", str(tmp_path), "s3://no-such-bucket-here/x", rank=0, world_size=1,
                            on_error=lambda h: (failed.append(h), got.set()))
    h = c.save(1, {"x": np.zeros(10)})
    assert h.wait() == "failed"
    assert h.error and "no-such-bucket-here" in h.error
    assert got.wait(10) and failed[0].step == 1
    # The local tier committed before the upload failed: the step is still restorable.
    assert c.load_latest()[0] == 1
    with pytest.raises(strata.InvalidInputError):
        c.save(2, {"x": object()})
    with pytest.raises(strata.InvalidInputError):
        strata.Checkpointer("../up", str(tmp_path))


def test_overlapping_saves_skip_by_policy(tmp_path):
    c = strata.Checkpointer("run-o", str(tmp_path), rank=0, world_size=1, overlap="skip")
    h1 = c.save(1, {"big": np.zeros(64 << 20, dtype=np.uint8)})
    h2 = c.save(2, {"x": np.zeros(3)})
    assert h2.state in ("skipped", "done")
    assert h1.wait() == "done"
    if h2.state == "skipped":
        assert c.steps() == [1]


KILL_LOOP = r"""
import os, sys, numpy as np, strata
local, remote = sys.argv[1], sys.argv[2]
c = strata.Checkpointer("run-kill", local, remote, rank=0, world_size=1, keep_local=2, keep_remote=2)
got = c.load_latest()
step = 0 if got is None else got[0]
first = True
while True:
    step += 1
    st = {"w": np.full(1 << 20, step, dtype=np.float32), "step": step}   # 4 MiB
    h = c.save(step, st)      # returns after the copy; the durability work runs in the background
    if first:
        # The parent kills at a random time after this: a slow start (imports on a loaded machine) is no
        # reason for a run to end before its first save committed.
        h.wait()
        print("saving", flush=True)
        first = False
"""


def test_sigkill_while_saving_never_leaves_an_uncommitted_or_corrupt_checkpoint(tmp_path, s3):
    rng = random.Random(2)
    local = str(tmp_path / "nvme")
    first_committed = None
    for i in range(6):
        p = subprocess.Popen([sys.executable, "-c", KILL_LOOP, local, s3], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "saving", "the saving loop did not start"
        time.sleep(rng.uniform(0.0, 2.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        c = strata.Checkpointer("run-kill", local, s3, rank=0, world_size=1)
        got = c.load_latest()
        if got is None:
            assert first_committed is None, "a committed checkpoint disappeared"
            continue
        step, state = got
        first_committed = first_committed or step
        # Only committed, verified checkpoints load, and their content is that step's.
        assert state["step"] == step and np.all(state["w"] == step), (i, step)
        for s in c.steps():
            assert c.load(s)["step"] == s
    assert first_committed is not None, "no save ever committed in 6 runs"


def test_cli_ls_show_verify_restore_rm(tmp_path, s3):
    from conftest import STRATA

    c = strata.Checkpointer("run-cli", str(tmp_path / "a"), s3, rank=0, world_size=1, keep_local=0)
    for step in (1, 2):
        assert c.save(step, model_state(step)).wait() == "done"
    tiers = ["--local", str(tmp_path / "a"), "--remote", s3]
    env = dict(os.environ)

    def cli(*args, ok=True):
        r = subprocess.run([STRATA, "ckpt", *args], capture_output=True, text=True, env=env)
        if ok:
            assert r.returncode == 0, r.stderr
        return r

    ls = json.loads(cli("ls", "run-cli", *tiers, "--json").stdout)
    assert [x["step"] for x in ls] == [2, 1] and len(ls[0]["tiers"]) == 2
    assert json.loads(cli("show", "run-cli", "2", *tiers).stdout)["step"] == 2
    assert "NOT" not in cli("verify", "run-cli", *tiers).stdout
    # A new node: restore step 2 into an empty local tier from the object store, then load it locally.
    cli("restore", "run-cli", "2", "--local", str(tmp_path / "b"), "--remote", s3)
    local_only = strata.Checkpointer("run-cli", str(tmp_path / "b"), rank=0, world_size=1)
    assert same(local_only.load(2), model_state(2))
    # Corrupt every copy of step 1: verify fails with a clear line.
    (shard,) = glob.glob(str(tmp_path / "a" / "run-cli" / "*1" / "rank-00000.safetensors"))
    open(shard, "wb").write(b"junk")
    r = cli("verify", "run-cli", "1", "--local", str(tmp_path / "a"), ok=False)
    assert r.returncode == 1 and "NOT restorable" in r.stdout and "mismatch" in r.stdout
    # A step committed locally only (upload_every skipped it, or the trainer was killed) is pushed later.
    local_only_save = strata.Checkpointer("run-cli", str(tmp_path / "a"), rank=0, world_size=1, keep_local=0)
    assert local_only_save.save(3, model_state(3)).wait() == "done"
    assert "step 3" in cli("push", "run-cli", *tiers).stdout
    remote_only = strata.Checkpointer("run-cli", str(tmp_path / "c"), s3, rank=0, world_size=1)
    assert remote_only.steps()[0] == 3 and same(remote_only.load(3), model_state(3))
    cli("rm", "run-cli", "1", *tiers)
    assert [x["step"] for x in json.loads(cli("ls", "run-cli", *tiers, "--json").stdout)] == [3, 2]
    assert cli("ls", "run-cli", ok=False).returncode != 0


class Agent:
    """A bare `strata serve` on embedded defaults: one node's agent for the peer tier."""

    def __init__(self, root):
        from conftest import STRATA

        self.data = os.path.join(root, "data")
        self.proc = subprocess.Popen([STRATA, "serve", "--data-dir", self.data, "--api-listen", "127.0.0.1:0",
                                      "--s3-listen", "127.0.0.1:0"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, STRATA_LOG="warn"))
        addr = os.path.join(self.data, "api.addr")
        deadline = time.time() + 30
        while not (os.path.exists(addr) and open(addr).read().strip()):
            assert self.proc.poll() is None and time.time() < deadline, "agent did not start"
            time.sleep(0.05)
        self.api = open(addr).read().strip()

    def replica(self, run, step, rank):
        # The administrator's token has no team: its replicas are in the shared store.
        return glob.glob(os.path.join(self.data, "peer-checkpoints", "shared", run, f"step-*{step}",
                                      f"rank-{rank:05}.safetensors"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture()
def three_nodes(tmp_path):
    agents = [Agent(str(tmp_path / f"node{i}")) for i in range(3)]
    yield agents
    for a in agents:
        a.stop()


def test_peer_tier_with_three_agents(tmp_path, three_nodes):
    """Three agents on loopback play three nodes; one rank per node, each shard replicated to the two others."""
    peers = [a.api for a in three_nodes]
    local = [str(tmp_path / f"node{i}" / "nvme") for i in range(3)]
    cks = [strata.Checkpointer("run-p", local[r], peers=peers, self_peer=r, replicas=2, rank=r, world_size=3,
                               local_world_size=1, keep_local=0, commit_timeout=60)
           for r in range(3)]
    for step in (1, 2):
        hs = [c.save(step, model_state(step * 10 + r)) for r, c in enumerate(cks)]
        assert [h.wait() for h in hs] == ["done"] * 3, [h.error for h in hs]
    # Each shard sits on the two other nodes' agents, never on its own node's.
    for r in range(3):
        holders = [i for i, a in enumerate(three_nodes) if a.replica("run-p", 2, r)]
        assert holders == [i for i in range(3) if i != r]
    # Node 1 loses its disk: its shard comes from a peer, verified.
    shutil.rmtree(local[1])
    fresh = strata.Checkpointer("run-p", local[1], peers=peers, self_peer=1, rank=1, world_size=3,
                                local_world_size=1)
    step, got = fresh.load_latest()
    assert step == 2 and same(got, model_state(21))
    # The first peer's replica is corrupt: never loaded; the other peer's is.
    (p,) = three_nodes[2].replica("run-p", 2, 1)
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(p, "wb").write(bytes(data))
    assert same(fresh.load(2), model_state(21))
    # A peer goes down as well: the remaining replica still serves... and when none verifies, the newest
    # checkpoint that does is loaded instead.
    three_nodes[0].stop()
    step, got = fresh.load_latest()
    assert step == 1 and same(got, model_state(11))


HANDOFF = r"""
import sys, numpy as np, strata
local, remote, agent = sys.argv[1], sys.argv[2], sys.argv[3]
c = strata.Checkpointer("run-h", local, remote, rank=0, world_size=1, agent=agent)
h = c.save(1, {"w": np.full(8 << 20, 7, dtype=np.float32), "step": 1})   # 32 MiB
print(h.wait_released(), flush=True)   # what the interpreter does at exit anyway
"""


def test_the_agent_finishes_a_save_after_the_process_exits(tmp_path, s3):
    agent = Agent(str(tmp_path / "node"))  # inherits the AWS_* environment of the s3 fixture
    try:
        # The local tier lies in a directory of the agent's local backend: the agent reads only what the
        # caller may write.
        local = os.path.join(agent.data, "objects", "nvme")
        out = subprocess.run([sys.executable, "-c", HANDOFF, local, s3, agent.api], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() in ("handed_over", "done")
        # The process is gone; the object store gets the checkpoint anyway, from the agent.
        remote_only = strata.Checkpointer("run-h", str(tmp_path / "elsewhere"), s3, rank=0, world_size=1,
                                          agent="")
        deadline = time.time() + 60
        while time.time() < deadline and remote_only.steps() != [1]:
            time.sleep(0.2)
        assert remote_only.steps() == [1]
        step, st = remote_only.load_latest()
        assert step == 1 and st["step"] == 1 and np.all(st["w"] == 7)
        base = agent.api if "://" in agent.api else f"http://{agent.api}"
        import urllib.request

        status = json.load(api_get(f"{base}/v1/ckpt/handoff?run=run-h&step=1&rank=0"))
        assert status["state"] == "done", status
    finally:
        agent.stop()


def test_a_step_committed_while_the_store_was_down_is_uploaded_by_the_next_process(tmp_path, monkeypatch):
    """Committed means eventually durable: saves whose upload failed (the object store was down) stay in the
    local tier (keep_local=1 deletes none of them) and the next Checkpointer of the run uploads them."""
    from conftest import ORIGIN_KEY, ORIGIN_SECRET, VENV_BIN, client, free_port, wait_port

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"

    def moto():
        p = subprocess.Popen([os.path.join(VENV_BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, p)
        client(endpoint, ORIGIN_KEY, ORIGIN_SECRET).create_bucket(Bucket="later")
        return p

    for k, v in (("AWS_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", ORIGIN_KEY),
                 ("AWS_SECRET_ACCESS_KEY", ORIGIN_SECRET), ("AWS_REGION", "us-east-1"), ("AWS_ALLOW_HTTP", "true")):
        monkeypatch.setenv(k, v)
    local = str(tmp_path / "nvme")
    server = moto()
    try:
        c = strata.Checkpointer("run-d", local, "s3://later/runs", rank=0, world_size=1, agent="", keep_local=1)
        assert c.save(1, model_state(1)).wait() == "done"
        server.terminate()
        server.wait()
        for step in (2, 3):
            assert c.save(step, model_state(step)).wait() == "failed"
        kept = sorted(int(p[-20:]) for p in glob.glob(os.path.join(local, "run-d", "step-*")))
        assert kept[-2:] == [2, 3], kept
        server = moto()   # back, empty: the store lost nothing it had, but has none of these
        again = strata.Checkpointer("run-d", local, "s3://later/runs", rank=0, world_size=1, agent="")
        again.pending_uploads.join(timeout=60)
        elsewhere = strata.Checkpointer("run-d", str(tmp_path / "other-node"), "s3://later/runs", rank=0,
                                        world_size=1, agent="")
        assert sorted(elsewhere.steps()) == kept
        step, got = elsewhere.load_latest()
        assert step == 3 and same(got, model_state(3))
    finally:
        server.terminate()
        server.wait()


KILL_MID_UPLOAD = r"""
import sys, numpy as np, strata
local, remote = sys.argv[1], sys.argv[2]
c = strata.Checkpointer("run-mpu", local, remote, rank=0, world_size=1, agent="")
st = {"w": np.arange(24 << 20, dtype=np.float32), "step": 1}   # 96 MiB: six parts
c.save(1, st).wait()
print("finished", flush=True)
"""


def test_a_save_killed_mid_upload_leaves_no_incomplete_upload_after_the_next_start(tmp_path, s3, s3_env):
    """kill -9 while a shard's multipart upload is in flight leaves its parts at the store; the next
    Checkpointer of the run aborts that upload (its key is journaled in the local tier), then uploads the step
    the killed process had committed locally."""
    bucket = s3[len("s3://"):].split("/", 1)[0]
    local = str(tmp_path / "nvme")
    p = subprocess.Popen([sys.executable, "-c", KILL_MID_UPLOAD, local, s3], stdout=subprocess.PIPE)
    deadline = time.time() + 120
    while not s3_env.list_multipart_uploads(Bucket=bucket).get("Uploads"):
        assert p.poll() is None, "the save finished before its upload was seen"
        assert time.time() < deadline, "no upload started"
        time.sleep(0.01)
    # A part in, then at once: a fixed pause let a fast machine finish all six parts before the kill.
    up = s3_env.list_multipart_uploads(Bucket=bucket)["Uploads"][0]
    while not s3_env.list_parts(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"]).get("Parts"):
        assert p.poll() is None, "the save finished before a part was seen"
        assert time.time() < deadline, "no part uploaded"
        time.sleep(0.005)
    p.kill()
    p.wait()
    assert b"finished" not in p.stdout.read()
    left = s3_env.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in left] == ["runs/run-mpu/step-00000000000000000001/rank-00000.safetensors"], left
    assert os.listdir(os.path.join(local, "run-mpu", "uploads")) == ["rank-00000.step-00000000000000000001"]

    again = strata.Checkpointer("run-mpu", local, s3, rank=0, world_size=1, agent="")
    again.pending_uploads.join(timeout=120)
    assert not again.pending_uploads.is_alive()
    assert s3_env.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert os.listdir(os.path.join(local, "run-mpu", "uploads")) == []
    # Committed means eventually durable: the step the killed process committed locally is in the store now.
    assert again.steps() == [1]
    elsewhere = strata.Checkpointer("run-mpu", str(tmp_path / "other-node"), s3, rank=0, world_size=1, agent="")
    step, got = elsewhere.load_latest()
    assert step == 1 and np.array_equal(got["w"], np.arange(24 << 20, dtype=np.float32))


def test_a_step_killed_before_its_manifest_is_not_uploaded_and_its_resave_is_whole(tmp_path, s3):
    """A process killed after a step's shard and record were durable but before its manifest: that step was
    never committed, so the next process resumes from the one before and saves the step again. The pending
    uploads must not commit the dead process's copy in the store (the re-save then failed, after overwriting
    the store's shard with bytes that no longer matched its manifest)."""
    local = str(tmp_path / "nvme")
    dead = strata.Checkpointer("r", local, s3, rank=0, world_size=1, agent="", keep_local=0, upload_every=2)
    assert dead.save(1, {"w": np.full(4, 1.0, np.float32)}).wait() == "done"   # uploaded
    assert dead.save(2, {"w": np.full(4, 2.0, np.float32)}).wait() == "done"   # local only (upload_every=2)
    del dead
    os.remove(os.path.join(local, "r", "step-%020d" % 2, "manifest.json"))     # killed before the commit
    again = strata.Checkpointer("r", local, s3, rank=0, world_size=1, agent="", keep_local=0)
    step, _ = again.load_latest()
    assert step == 1
    again.pending_uploads.join(timeout=60)
    store = strata.Checkpointer("r", str(tmp_path / "store-only"), s3, rank=0, world_size=1, agent="")
    assert store.steps() == [1]
    h = again.save(2, {"w": np.full(4, 20.0, np.float32)})   # another value, as a GPU step may give
    assert h.wait() == "done", h.error
    assert np.array_equal(again.load(2)["w"], np.full(4, 20.0, np.float32))
    fresh = strata.Checkpointer("r", str(tmp_path / "fresh"), s3, rank=0, world_size=1, agent="")
    assert np.array_equal(fresh.load(2)["w"], np.full(4, 20.0, np.float32))


def test_a_committed_step_is_never_overwritten_by_another_save_of_it(tmp_path, s3):
    """A committed checkpoint is immutable: saving the same step again fails, and every tier keeps the
    committed bytes (a replaced shard would no longer match its manifest)."""
    local = str(tmp_path / "nvme")
    c = strata.Checkpointer("imm", local, s3, rank=0, world_size=1, agent="")
    assert c.save(3, {"w": np.full(4, 3.0, np.float32)}).wait() == "done"
    h = c.save(3, {"w": np.full(4, 30.0, np.float32)})
    assert h.wait() == "failed" and "already committed" in str(h.error), h.error
    assert np.array_equal(c.load(3)["w"], np.full(4, 3.0, np.float32))
    fresh = strata.Checkpointer("imm", str(tmp_path / "fresh"), s3, rank=0, world_size=1, agent="")
    assert np.array_equal(fresh.load(3)["w"], np.full(4, 3.0, np.float32))
