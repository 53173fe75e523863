"""`Checkpointer`: asynchronous, tiered, verified checkpoints of a training run."""

from __future__ import annotations

import atexit
import json
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import numpy as np

from strata import _dist, _native

_NP_TO_ST = {
    "float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32", "int16": "I16",
    "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
}
_ST_TO_NP = {v: k for k, v in _NP_TO_ST.items()}
TREE_KEY = "strata.tree"


def _torch():
    try:
        import torch

        return torch
    except ImportError:  # pragma: no cover - torch is optional
        return None


class SaveHandle:
    """A save in progress. ``wait()`` / ``done()``; ``state`` is ``pending``, ``handed_over`` (durable locally,
    the node agent finishes the rest), ``done``, ``skipped`` or ``failed`` (then ``error`` says why). A failed
    save never raises into the training loop."""

    def __init__(self, native: Any) -> None:
        self._h = native

    @property
    def step(self) -> int:
        return self._h.step

    @property
    def state(self) -> str:
        return self._h.state

    @property
    def error(self) -> Optional[str]:
        return self._h.error

    def done(self) -> bool:
        return self._h.done()

    def wait(self, timeout: Optional[float] = None) -> str:
        """Wait (GIL released) until the save is durable in every scheduled tier, or failed."""
        return self._h.wait(timeout)

    def wait_released(self, timeout: Optional[float] = None) -> str:
        """Wait until this process's part is over: the save finished, or the node agent took it over."""
        return self._h.wait(timeout, released=True)

    def __repr__(self) -> str:
        return f"SaveHandle(step={self.step}, state={self.state!r})"


def _flatten(state: Any, tensors: list, path: str) -> Any:
    """The tree's skeleton (JSON), appending `(name, dtype, shape, memoryview)` for every array leaf."""
    torch = _torch()
    if isinstance(state, dict):
        items = []
        for k, v in state.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise _native.InvalidInputError(f"{path or 'state'}: keys must be str or int, got {k!r}")
            items.append([["i", k] if isinstance(k, int) else ["s", k], _flatten(v, tensors, f"{path}/{k}")])
        return {"d": items}
    if isinstance(state, (list, tuple)):
        kind = "l" if isinstance(state, list) else "t"
        return {kind: [_flatten(v, tensors, f"{path}/{i}") for i, v in enumerate(state)]}
    name = path.lstrip("/") or "value"
    if torch is not None and isinstance(state, torch.Tensor):
        t = state.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            arr, dtype = t.view(torch.int16).numpy(), "BF16"
        else:
            arr = t.numpy()
            dtype = _NP_TO_ST.get(arr.dtype.name)
        if dtype is None:
            raise _native.InvalidInputError(f"{name}: tensor dtype {t.dtype} is not supported")
        tensors.append((name, dtype, list(t.shape), memoryview(arr.reshape(-1).view(np.uint8))))
        return {"x": name, "k": "torch"}
    if isinstance(state, np.ndarray):
        arr = np.ascontiguousarray(state)
        dtype = _NP_TO_ST.get(arr.dtype.name)
        if dtype is None:
            raise _native.InvalidInputError(f"{name}: array dtype {arr.dtype} is not supported")
        tensors.append((name, dtype, list(arr.shape), memoryview(arr.reshape(-1).view(np.uint8))))
        return {"x": name, "k": "numpy"}
    if isinstance(state, (bytes, bytearray, memoryview)):
        mv = memoryview(state).cast("B")
        tensors.append((name, "U8", [mv.nbytes], mv))
        return {"x": name, "k": "bytes"}
    if state is None or isinstance(state, (bool, int, float, str)):
        return {"v": state}
    raise _native.InvalidInputError(
        f"{name}: {type(state).__name__} cannot be checkpointed (tensors, arrays, bytes, numbers, strings, "
        "and dicts/lists of them)"
    )


def _unflatten(skel: Any, arrays: dict) -> Any:
    if "d" in skel:
        return {(k[1]): _unflatten(v, arrays) for k, v in skel["d"]}
    if "l" in skel:
        return [_unflatten(v, arrays) for v in skel["l"]]
    if "t" in skel:
        return tuple(_unflatten(v, arrays) for v in skel["t"])
    if "v" in skel:
        return skel["v"]
    name, kind = skel["x"], skel["k"]
    dtype, shape, buf, off, length = arrays[name]
    if kind == "bytes":
        return bytes(memoryview(buf)[off:off + length])
    if dtype == "BF16":
        torch = _torch()
        if torch is None:
            raise _native.StrataError(f"{name} is a bfloat16 tensor: loading it needs torch")
        if length == 0:
            return torch.empty(shape, dtype=torch.bfloat16)
        return torch.frombuffer(buf, dtype=torch.int16, count=length // 2, offset=off).view(
            torch.bfloat16).reshape(shape)
    np_dtype = np.dtype(_ST_TO_NP[dtype])
    if length == 0:
        arr = np.empty(shape, dtype=np_dtype)
        return _torch().from_numpy(arr) if kind == "torch" and _torch() is not None else arr
    # A view of the one buffer the shard was read into: no copy.
    arr = np.frombuffer(buf, dtype=np_dtype, count=length // np_dtype.itemsize, offset=off).reshape(shape)
    if kind == "torch" and _torch() is not None:
        return _torch().from_numpy(arr)
    return arr


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host list (``gpu[01-03,07],login1``) as host names."""
    hosts, depth, cur, parts = [], 0, "", []
    for ch in spec:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    if cur:
        parts.append(cur)
    for part in parts:
        if "[" not in part:
            hosts.append(part)
            continue
        prefix, rest = part.split("[", 1)
        body, suffix = rest.split("]", 1)
        for r in body.split(","):
            if "-" in r:
                a, b = r.split("-", 1)
                width = len(a)
                hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(a), int(b) + 1)]
            else:
                hosts.append(f"{prefix}{r}{suffix}")
    return hosts


def _resolve_peers(peers: Any) -> list[str]:
    if not peers:
        return []
    if peers == "slurm":
        nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        if not nodes:
            raise _native.InvalidInputError("peers='slurm' but SLURM_JOB_NODELIST is not set")
        port = os.environ.get("STRATA_PEER_PORT", "7070")
        return [f"{h}:{port}" for h in expand_hostlist(nodes)]
    if isinstance(peers, str):
        raise _native.InvalidInputError("peers: a list of agent addresses, or 'slurm'")
    return [str(p) for p in peers]


def _find_self(peers: list[str]) -> Optional[int]:
    norm = lambda a: a.split("://", 1)[-1].rstrip("/")  # noqa: E731
    agent = os.environ.get("STRATA_AGENT")
    if agent:
        for i, p in enumerate(peers):
            if norm(p) == norm(agent):
                return i
    import socket

    host = socket.gethostname().split(".")[0]
    for i, p in enumerate(peers):
        if norm(p).rsplit(":", 1)[0].split(".")[0] == host:
            return i
    return None


_LIVE: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    # save() has returned: finish this process's part of the durability work before the interpreter goes: all
    # of it, or, with a node agent, until the agent has taken the save over (after SIGKILL nothing runs here: an
    # interrupted save is never visible, its checkpoint has no manifest).
    for c in list(_LIVE):
        try:
            c._release_all()
        except Exception:  # pragma: no cover - best effort at exit
            pass


class Checkpointer:
    """Asynchronous, sharded checkpoints: one shard per rank, local tier first, then the object store.

    Args:
        run_id: names the run; only its checkpoints are listed or deleted.
        local_dir: the local tier (node-local NVMe). Shards are fsync'd and renamed into place.
        remote_url: the object store tier (``s3://bucket/prefix``; endpoint and credentials from ``AWS_*``), or
            None.
        peers: the agents (``strata serve`` control API addresses, ``host:port``) of every node of the job, in
            the same order on every rank, or ``"slurm"`` for the nodes of ``SLURM_JOB_NODELIST`` at port
            ``STRATA_PEER_PORT`` (7070). Each shard is replicated to ``replicas`` agents of other nodes; restore
            reads local first, then peers, then the object store.
        replicas: replicas per shard on other nodes (default 1 when peers are given).
        agent: this node's agent (``strata serve`` control API, ``host:port``); default ``STRATA_AGENT``; ``""``
            for none. Once a shard is durable locally, the agent replicates and uploads it, so the work goes on
            when the training process exits (at exit the process waits only until the agent took over). Without
            an agent, the process does it all and waits for it at exit.
        self_peer: this node's agent's index in ``peers`` (default: the one equal to ``STRATA_AGENT``, else the
            one on this host name).
        rank, world_size, local_world_size: default from the environment by the same rules as
            :class:`strata.StreamingDataset` (``RANK`` / ``WORLD_SIZE``, else ``LOCAL_RANK`` /
            ``LOCAL_WORLD_SIZE`` with ``NODE_RANK`` and ``NNODES``; the node's ranks from ``LOCAL_WORLD_SIZE``),
            else 0, 1 and the world size. On one node (local world = world) rank 0 also commits the local tier; on
            several, the manifest lives on the peers and the object store.
        upload_every: upload every N-th save to the object store.
        keep_local, keep_remote: keep the newest N committed checkpoints per tier (0 keeps all);
            keep_every: also keep steps that are multiples of K. The newest committed checkpoint is never
            deleted, and an older one only once a newer one is committed.
        overlap: ``"wait"`` (block save() until the previous save finished) or ``"skip"``.
        on_error: called with the handle of a failed save (from a helper thread).
        team: charge saves to this team's ``ckpt`` quota (default ``STRATA_TEAM``), through the agent: each save
            is admitted before any byte is written (refused: the handle fails with a quota error and nothing is
            written), charged once its shard is on the local tier, and given back when retention deletes it.
            Needs an agent and a token (``STRATA_TOKEN``) of a member of the team.

    ``save(step, state)`` copies the state (dicts/lists of torch tensors, numpy arrays, bytes, numbers,
    strings) and returns a :class:`SaveHandle`; the caller may change its tensors at once. ``load_latest()``
    returns ``(step, state)`` of the newest checkpoint complete for every rank, or None; every shard is
    verified (blake3) and read from the local tier, else the object store.
    """

    def __init__(
        self,
        run_id: str,
        local_dir: str,
        remote_url: Optional[str] = None,
        peers: Optional[Any] = None,
        *,
        replicas: int = 1,
        self_peer: Optional[int] = None,
        agent: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        local_world_size: Optional[int] = None,
        upload_every: int = 1,
        keep_local: int = 2,
        keep_remote: int = 0,
        keep_every: Optional[int] = None,
        overlap: str = "wait",
        on_error: Optional[Callable[[SaveHandle], None]] = None,
        commit_timeout: float = 600.0,
        team: Optional[str] = None,
    ) -> None:
        env = os.environ
        peer_list = _resolve_peers(peers)
        if self_peer is None and peer_list:
            self_peer = _find_self(peer_list)
        self.rank, self.world_size = _dist.resolve_rank(rank, world_size)
        local_world = _dist.local_world_size(self.world_size, local_world_size)
        os.makedirs(local_dir, exist_ok=True)
        self._native = _native.Checkpointer(
            run_id, local_dir, remote_url=remote_url, peers=peer_list, self_peer=self_peer, replicas=replicas,
            agent=(os.environ.get("STRATA_AGENT") if agent is None else agent) or None,
            rank=self.rank, world_size=self.world_size,
            local_is_shared=local_world == self.world_size, upload_every=upload_every, keep_local=keep_local,
            keep_remote=keep_remote, keep_every=keep_every, overlap=overlap, commit_timeout=commit_timeout,
            team=(env.get("STRATA_TEAM") if team is None else team) or None,
        )
        self.run_id = run_id
        self._on_error = on_error
        self._handles: list[SaveHandle] = []  # saves whose process part may still be running
        _LIVE.add(self)
        # Committed means eventually durable: steps a previous process of this run committed locally but never
        # uploaded (the store was down, it was killed) go up now, in the background.
        self.pending_uploads: Optional[threading.Thread] = None
        if remote_url:
            self.pending_uploads = threading.Thread(target=self._finish_pending, name="strata-ckpt-pending",
                                                    daemon=True)
            self.pending_uploads.start()

    def _finish_pending(self) -> None:
        try:
            self._native.finish_pending()
        except Exception as e:  # the next start tries again; the steps stay local meanwhile
            warnings.warn(f"uploading checkpoint steps left local by a previous process: {e}", RuntimeWarning,
                          stacklevel=1)

    def save(self, step: int, state: Any, metadata: Optional[dict] = None) -> SaveHandle:
        tensors: list = []
        skel = _flatten(state, tensors, "")
        md = {str(k): str(v) for k, v in (metadata or {}).items()}
        md[TREE_KEY] = json.dumps(skel)
        h = SaveHandle(self._native.save(int(step), tensors, md))
        self._handles = [x for x in self._handles if x.state == "pending"] + [h]
        if self._on_error is not None:
            cb = self._on_error

            def watch() -> None:
                if h.wait() == "failed":
                    cb(h)

            threading.Thread(target=watch, name=f"strata-ckpt-{step}", daemon=True).start()
        return h

    def _restore(self, got: Any) -> Any:
        step, tensors, md, buf = got
        arrays = {name: (dtype, shape, buf, off, length) for name, dtype, shape, off, length in tensors}
        skel = md.get(TREE_KEY)
        if skel is None:  # written by another tool: a flat dict of arrays
            return step, {n: _unflatten({"x": n, "k": "numpy"}, arrays) for n in arrays}
        return step, _unflatten(json.loads(skel), arrays)

    def _map_local(self, step: Optional[int]) -> Any:
        """The verified local shard, mapped copy-on-write: tensors are views of the page cache, read lazily, and
        writable (a write copies only the page it touches). None when the local tier has no verified copy."""
        plan = self._native.local_verified(step)
        if plan is None:
            return None
        s, path, tensors, md, (dev, ino, size, mtime_ns) = plan
        import mmap

        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (dev, ino, size, mtime_ns):
                return None  # replaced since it was verified
            if size == 0:
                return None
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return s, tensors, md, mm

    def load_latest(self) -> Optional[tuple[int, Any]]:
        """``(step, state)`` of the newest complete checkpoint this rank can verify, or None."""
        got = self._map_local(None) or self._native.load(None)
        return None if got is None else self._restore(got)

    def load(self, step: int) -> Any:
        """The state saved at `step` (complete for every rank; this rank's shard verified)."""
        got = self._map_local(int(step)) or self._native.load(int(step))
        return self._restore(got)[1]

    def steps(self) -> list[int]:
        """Committed steps, newest first."""
        return self._native.steps()

    def flush(self) -> None:
        """Wait for every save in progress."""
        self._native.flush()

    def _release_all(self) -> None:
        for h in list(self._handles):
            h.wait_released()

    def delete(self, step: int) -> None:
        """Delete a checkpoint from every tier."""
        self._native.delete(int(step))
