"""Errors as Python sees them: one exception class per error kind of the Rust core, each with `kind` and
`retryable`, kept across the agent's wire and through pickling (DataLoader workers); one rank discovery for
the loader and the checkpointer."""
import pickle

import pytest

import strata
from test_loader import upload_dir, write_wds

# The kinds of the Rust core (strata_types::ErrorKind::as_str), each with its class.
KINDS = {
    "not_found": strata.NotFoundError,
    "already_exists": strata.AlreadyExistsError,
    "precondition_failed": strata.ChangedError,
    "invalid_input": strata.InvalidInputError,
    "config": strata.ConfigError,
    "invalid_range": strata.InvalidRangeError,
    "permission_denied": strata.PermissionDeniedError,
    "unauthenticated": strata.UnauthenticatedError,
    "unavailable": strata.UnavailableError,
    "timeout": strata.TimedOutError,
    "io": strata.StorageIOError,
    "no_space": strata.NoSpaceError,
    "corrupt": strata.CorruptDataError,
    "unsupported": strata.UnsupportedError,
    "cancelled": strata.OperationCancelledError,
    "resource_exhausted": strata.ResourceExhaustedError,
    "internal": strata.InternalError,
}


def test_one_class_per_kind_with_its_kind_and_default_retryability():
    assert len(set(KINDS.values())) == len(KINDS)
    for kind, cls in KINDS.items():
        assert issubclass(cls, strata.StrataError)
        assert cls.kind == kind
        assert cls.retryable is (kind in ("unavailable", "timeout")), kind
        e = cls("raised from Python")
        assert (e.kind, e.retryable) == (kind, cls.retryable)
    # Narrower kinds stay catchable as the broader ones they were before.
    assert issubclass(strata.ConfigError, strata.InvalidInputError)
    assert issubclass(strata.TimedOutError, strata.UnavailableError)
    assert issubclass(strata.NoSpaceError, strata.StorageIOError)


def test_an_error_from_the_core_carries_kind_and_retryable_through_pickling(tmp_path):
    with pytest.raises(strata.NotFoundError) as e:
        strata.StreamingDataset(str(tmp_path / "nothing-here"))
    assert (e.value.kind, e.value.retryable) == ("not_found", False)
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is strata.NotFoundError
    assert (back.kind, back.retryable, str(back)) == ("not_found", False, str(e.value))


def test_the_agent_s_refusal_keeps_its_kind(s3_env, gateway, tmp_path, monkeypatch):
    """A forged token is `unauthenticated`, not a retryable `unavailable` (what the loader made of any status
    it did not list)."""
    d = write_wds(str(tmp_path / "errds"), 20, 10, seed=2)
    upload_dir(s3_env, "gw-origin", "loader/errds", d)
    assert strata.index_dataset("s3://gw-origin/loader/errds") == 20
    monkeypatch.setenv("STRATA_TOKEN", "forged-token")
    with pytest.raises(strata.StrataError) as e:
        list(strata.StreamingDataset("s3://gw-origin/loader/errds", agent=gateway.api, cache="agent"))
    assert type(e.value) is strata.UnauthenticatedError, repr(e.value)
    assert (e.value.kind, e.value.retryable) == ("unauthenticated", False)


def test_the_checkpointer_finds_its_rank_as_the_loader_does(tmp_path, monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "NNODES", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("NNODES", "2")
    ck = strata.Checkpointer("run-rank", str(tmp_path / "ck"))
    from strata import _dist

    assert (ck.rank, ck.world_size) == _dist.resolve_rank() == (3, 4)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(strata.InvalidInputError, match="RANK"):
        strata.Checkpointer("run-rank", str(tmp_path / "ck"))


@pytest.mark.parametrize("failure", ["changed", "corrupt", "origin_down", "worker_killed"])
def test_every_failure_in_a_dataloader_worker_reaches_the_training_loop(tmp_path, failure, monkeypatch):
    """Through a DataLoader with two workers, an epoch either yields every sample of the partition or raises:
    a shard changed after indexing, a corrupt one, the object store going away mid-epoch, a killed worker."""
    import os
    import signal
    import subprocess
    import time

    import torch
    from conftest import ORIGIN_KEY, ORIGIN_SECRET, VENV_BIN, client, free_port, wait_port

    d = write_wds(str(tmp_path / "ds"), 400, 50)
    total = 400
    url, moto = d, None
    if failure == "origin_down":
        port = free_port()
        moto = subprocess.Popen([os.path.join(VENV_BIN, "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port, moto)
        endpoint = f"http://127.0.0.1:{port}"
        s3 = client(endpoint, ORIGIN_KEY, ORIGIN_SECRET)
        s3.create_bucket(Bucket="down")
        upload_dir(s3, "down", "ds", d)
        for k, v in (("AWS_ENDPOINT_URL", endpoint), ("AWS_ACCESS_KEY_ID", ORIGIN_KEY),
                     ("AWS_SECRET_ACCESS_KEY", ORIGIN_SECRET), ("AWS_REGION", "us-east-1"),
                     ("AWS_ALLOW_HTTP", "true")):
            monkeypatch.setenv(k, v)
        url = "s3://down/ds"
    strata.index_dataset(url)
    shard = os.path.join(d, "shard-00005.tar")
    data = open(shard, "rb").read()
    if failure == "changed":
        open(shard, "wb").write(data[: len(data) // 2])
    elif failure == "corrupt":
        open(shard, "wb").write(data[1024:] + b"\0" * 1024)   # same size, other bytes
    ds = strata.StreamingDataset(url, shuffle=False)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = 0
    try:
        if failure == "origin_down":
            # Indexed and opened; then the store goes away before the workers read a byte of it.
            moto.terminate()
            moto.wait()
        with pytest.raises(BaseException) as e:
            it = iter(dl)
            for _ in it:
                seen += 1
                if seen == 20 and failure == "worker_killed":
                    os.kill(it._workers[0].pid, signal.SIGKILL)
                    time.sleep(0.5)
        assert seen < total, "the epoch ended as if complete"
        want = {"changed": strata.ChangedError, "corrupt": (strata.CorruptDataError, strata.ChangedError),
                "origin_down": strata.UnavailableError, "worker_killed": RuntimeError}[failure]
        assert isinstance(e.value, want), repr(e.value)
        if failure != "worker_killed":
            assert "shard-00005.tar" in str(e.value) or failure == "origin_down", str(e.value)
    finally:
        if moto and moto.poll() is None:
            moto.terminate()
            moto.wait()


def test_a_stopping_agent_answers_every_request_it_accepted(origin):
    """Issue 44, finding 10: a request whose connection the kernel accepted before SIGTERM gets an answer from
    the API and the gateway alike: the server stops accepting, then serves what was accepted. The agent is
    stopped (SIGSTOP) while the connections are made and their requests sent, so they are all queued when it
    wakes to its SIGTERM."""
    import signal
    import socket

    from conftest import Gateway
    gw = Gateway(origin)
    targets = [(gw.api, "/healthz")] * 8 + [(gw.endpoint, "/")] * 8
    socks = []
    try:
        gw.proc.send_signal(signal.SIGSTOP)
        for base, path in targets:
            host, port = base.replace("http://", "").split(":")
            s = socket.create_connection((host, int(port)), timeout=60)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
            socks.append((base, s))
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.send_signal(signal.SIGCONT)
        unanswered = []
        for base, s in socks:
            data = b""
            try:
                while chunk := s.recv(65536):
                    data += chunk
            except OSError as e:
                unanswered.append(f"{base}: {type(e).__name__}: {e}")
                continue
            if not data.startswith(b"HTTP/1.1 "):
                unanswered.append(f"{base}: {data[:80]!r}")
        assert not unanswered, unanswered
        gw.proc.wait(timeout=60)
    finally:
        for _, s in socks:
            s.close()
        gw.proc.send_signal(signal.SIGCONT)
        gw.close()
