"""`StreamingDataset`: deterministic, resumable streaming of sharded datasets."""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator, Optional

from strata import _claim, _dist, _native

try:  # torch is optional: without it the dataset is a plain iterable.
    import torch.utils.data as _tud

    _Base: type = _tud.IterableDataset
except ImportError:  # pragma: no cover - exercised where torch is absent
    _tud = None
    _Base = object


def _job_from_env():
    """The job a process's I/O is counted to, by the rule ``strata mount`` follows: ``STRATA_JOB`` (a claim
    gives its job this), else ``SLURM_JOB_ID``, else in a Kubernetes pod its name (``HOSTNAME`` there)."""
    for name in ("STRATA_JOB", "SLURM_JOB_ID"):
        v = os.environ.get(name, "").strip()
        if v:
            return v
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return os.environ.get("HOSTNAME", "").strip() or None
    return None

class _SharedSample(dict):
    """A DataLoader worker's sample (copying mode) whose bytes fields were copied out of shared memory.

    It is the dict the training loop would get. Only the multiprocessing pickler treats it differently: a field
    still holding the very bytes object the loader made crosses as a handle to the shared copy, and the
    training process copies it into a new ``bytes`` there (one copy, where pickling the bytes through the
    DataLoader's pipe costs four). A field the worker replaced (a decoded image, a new dict) is pickled as it is.
    """

    __slots__ = ("_shared",)

    def __reduce__(self) -> Any:  # plain pickle: a plain dict
        return (dict, (dict(self),))


class _SharedBatch(dict):
    """A batch of :class:`_SharedSample` made by ``default_collate`` (fields as lists), pickled likewise."""

    __slots__ = ("_shared",)

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


def _adopt_buffer(*handle: Any) -> Any:
    return _native.Buffer._adopt(*handle)


def _adopt_copy(handle: Any) -> bytes:
    # The copy into bytes; the Buffer (and its reference to the slot) is gone right after.
    return bytes(_native.Buffer._adopt(*handle))


def _handle_for(value: Any, entry: Any) -> Any:
    """A handle for `value` when it is still the loader's bytes object recorded in `entry`, else None."""
    if entry is not None and entry[0] is value:
        return entry[1]._share()
    return None


def _reduce_shared_sample(s: _SharedSample) -> Any:
    # A copy made by torch (default_convert rebuilds a mapping with its type) has no record: all pickled.
    shared = getattr(s, "_shared", None) or {}
    items = []
    for k, v in dict.items(s):
        h = _handle_for(v, shared.get(k))
        items.append((k, h, None if h is not None else v))
    return (_rebuild_shared_sample, (items,))


def _rebuild_shared_sample(items: list) -> dict:
    return {k: (_adopt_copy(h) if h is not None else v) for k, h, v in items}


def _reduce_shared_batch(b: _SharedBatch) -> Any:
    shared = getattr(b, "_shared", None) or {}
    items = []
    for k, v in dict.items(b):
        entries = shared.get(k)
        if entries is not None and isinstance(v, list) and len(v) == len(entries):
            hs = [_handle_for(x, e) for x, e in zip(v, entries)]
            items.append((k, True, [(h, None if h is not None else x) for h, x in zip(hs, v)]))
        else:
            items.append((k, False, v))
    return (_rebuild_shared_batch, (items,))


def _rebuild_shared_batch(items: list) -> dict:
    out = {}
    for k, listed, v in items:
        out[k] = [(_adopt_copy(h) if h is not None else x) for h, x in v] if listed else v
    return out


try:  # default_collate keeps a batch of Buffers as a list, as it does for bytes.
    from torch.utils.data._utils.collate import collate as _collate
    from torch.utils.data._utils.collate import default_collate_fn_map as _collate_map

    def _collate_buffers(batch: Any, *, collate_fn_map: Any = None) -> Any:
        return batch

    def _collate_shared(batch: Any, *, collate_fn_map: Any = None) -> Any:
        # As default_collate collates a dict, remembering which lists still hold the loader's bytes.
        out = _SharedBatch()
        shared = {}
        for key in batch[0]:
            values = [d[key] for d in batch]
            out[key] = _collate(values, collate_fn_map=collate_fn_map)
            entries = [getattr(d, "_shared", {}).get(key) for d in batch]
            if isinstance(out[key], list) and any(e is not None for e in entries):
                shared[key] = entries
        out._shared = shared
        return out

    _collate_map.setdefault(_native.Buffer, _collate_buffers)
    _collate_map.setdefault(_SharedSample, _collate_shared)
except ImportError:  # pragma: no cover - torch absent or too old to have the map
    pass

try:  # What DataLoader workers send crosses the result queue as handles to shared memory, not bytes.
    from multiprocessing.reduction import ForkingPickler as _ForkingPickler

    def _reduce_buffer(b: Any) -> Any:
        handle = b._share()
        if handle is None:
            return (bytes, (bytes(b),))
        return (_adopt_buffer, handle)

    # Only the multiprocessing pickler: a handle carries one reference and must be unpickled exactly once,
    # which a queue guarantees and a file written with pickle.dump does not.
    _ForkingPickler.register(_native.Buffer, _reduce_buffer)
    _ForkingPickler.register(_SharedSample, _reduce_shared_sample)
    _ForkingPickler.register(_SharedBatch, _reduce_shared_batch)
except ImportError:  # pragma: no cover - multiprocessing is part of the standard library
    pass

STATE_VERSION = 1


class StreamingDataset(_Base):  # type: ignore[misc,valid-type]
    """Samples of a WebDataset or MDS dataset, as dicts, in a seeded global order.

    Args:
        url: ``s3://bucket/prefix``, ``file:///dir`` or a local directory holding ``strata-manifest.json``,
            an MDS ``index.json``, or ``.tar`` shards (scanned once at open).
        shuffle: shuffle shards and, inside windows of ``shuffle_window`` samples, samples.
        seed: the shuffle seed. Seed and epoch define the order, bit for bit, whatever the number of nodes,
            ranks or workers.
        shuffle_window: samples permuted together (larger mixes more). Default: as many samples as fit in
            384 MiB (64 to 16,384), from the dataset's average sample size. The window's bytes are read at
            random while it is consumed, so they should fit ``cache_bytes``.
        batch_size: the DataLoader's batch size. Workers take turns batch by batch as the DataLoader
            consumes them, so a rank's samples arrive in the same order with any number of workers.
        tail: ``"drop"`` (each rank gets ``floor(remaining / world)`` samples per epoch; at most ``world - 1``
            are skipped) or ``"pad"`` (``ceil``; the missing ones repeat samples from the start of the epoch).
        rank, world_size: this rank and the number of ranks; default from ``RANK`` / ``WORLD_SIZE`` (or
            ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` with ``NODE_RANK`` / ``GROUP_RANK``), else 0 and 1.
        agent: address of the node agent's API (``http://127.0.0.1:7070``); default ``STRATA_AGENT``. With an
            agent all ranks of the node share its cache; ``cache="local"`` forces the in-process cache.
        cache: ``"auto"`` (agent if known, else local), ``"agent"`` or ``"local"``.
        cache_bytes: RAM of the rank's in-process cache (default: the shuffle window's bytes plus a quarter,
            256 MiB to 4 GiB). DataLoader workers read through their rank's cache (a Unix socket), so each
            block is fetched once per rank and stays warm across epochs. cache_dir / cache_dir_bytes:
            optional disk tier for it (``cache_dir/rank-N``).
        block_size: cache block, the unit read from storage.
        prefetch_bytes: bytes of samples read ahead of the training loop, per consumer. A sample larger than
            this is still read, alone (a cache or window smaller than a shard never deadlocks).
        prefetch_samples: samples fetched concurrently per consumer.
        skip_corrupt: skip samples that fail to decode (counted in ``stats()["skipped"]``) instead of raising.
        job: job id recorded with the I/O (default ``STRATA_JOB``, which a claim gives its job, else
            ``SLURM_JOB_ID``, else the pod's name on Kubernetes).
        zero_copy: binary fields come as :class:`strata.Buffer` (read-only, shares Strata's memory: the buffer
            protocol, ``len``, ``bytes()``, ``decode()``, indexing and slicing, ``==``; it pickles as ``bytes``)
            instead of ``bytes``, and numpy fields share it too where aligned. It saves one copy of every sample
            (for large samples in the training process, most of the loader's CPU). A buffer keeps the memory it
            shares alive (in the training process, possibly a whole cache block), so copy what you keep.
            ``default_collate`` keeps a batch of Buffers as a list, as it does for bytes.
        shared_memory_bytes: DataLoader workers (forked) read samples into a shared-memory region made with the
            dataset, and the DataLoader's queue carries handles to it instead of pickled bytes (the copies
            through the pipe were most of the CPU of an epoch with workers): with ``zero_copy`` the training
            process gets Buffers over the same memory; without it, ``bytes`` copied there once (a field a worker
            replaced, e.g. by a decoded image, is pickled as usual). This is the region's size (reserved, not
            touched: resident memory grows with the samples held at once by workers, the DataLoader's queues and
            the loop). When it is full (or 0), workers' samples are pickled as bytes. Space held by samples that
            never reached the training process (an iteration abandoned mid-epoch, a killed worker) is reclaimed
            once their worker has exited; ``shared_memory_in_use`` tells how much is held.

    Resumption: ``state_dict(consumed)`` records the epoch and the global position reached when every rank has
    consumed ``consumed`` samples this epoch (in-process iteration counts by itself). ``load_state_dict``
    continues the same global order from there, with any world size: no sample repeated or skipped.
    """

    def __init__(
        self,
        url: str,
        *,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_window: Optional[int] = None,
        batch_size: int = 1,
        tail: str = "drop",
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        agent: Optional[str] = None,
        cache: str = "auto",
        cache_bytes: Optional[int] = None,
        cache_dir: Optional[str] = None,
        cache_dir_bytes: int = 0,
        block_size: int = 8 << 20,
        prefetch_bytes: int = 64 << 20,
        prefetch_samples: int = 32,
        skip_corrupt: bool = False,
        job: Optional[str] = None,
        zero_copy: bool = False,
        shared_memory_bytes: int = 1 << 30,
    ) -> None:
        if cache not in ("auto", "agent", "local"):
            raise _native.InvalidInputError(f"cache={cache!r}: expected 'auto', 'agent' or 'local'")
        if agent is None and cache != "local":
            agent = os.environ.get("STRATA_AGENT") or None
        if cache == "agent" and agent is None:
            raise _native.InvalidInputError("cache='agent' but no agent address (agent= or STRATA_AGENT)")
        if cache == "local":
            agent = None
        if batch_size < 1:
            raise _native.InvalidInputError("batch_size must be at least 1")
        self.rank, self.world_size = _dist.resolve_rank(rank, world_size)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.zero_copy = bool(zero_copy)
        self._native = _native.Dataset(
            url,
            agent=agent,
            cache_bytes=cache_bytes,
            cache_dir=cache_dir,
            cache_dir_bytes=cache_dir_bytes,
            cache_tag=f"rank-{self.rank}",
            block_size=block_size,
            shuffle=shuffle,
            seed=seed,
            window=shuffle_window,
            tail=tail,
            prefetch_bytes=prefetch_bytes,
            prefetch_samples=prefetch_samples,
            skip_corrupt=skip_corrupt,
            job=job if job is not None else _job_from_env(),
            shared_memory_bytes=max(0, int(shared_memory_bytes)),
        )
        self.shuffle_window = self._native.window
        span = (self.shuffle_window or 1) * self._native.avg_sample_bytes
        if shuffle and cache_bytes is not None and 0 < self._native.cache_bytes < span:
            warnings.warn(
                f"strata: cache_bytes={cache_bytes} is smaller than the shuffle window's {span} bytes "
                f"({self.shuffle_window} samples): blocks will be read again and again; raise cache_bytes or "
                "lower shuffle_window",
                stacklevel=2,
            )
        self.epoch = 0
        self._start = 0  # global position the current epoch resumes at
        self._consumed = 0  # samples this rank consumed in-process this epoch
        self._last_stats: dict = {}
        self._iter: Optional[Any] = None

    # -- sizes ---------------------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Samples in the dataset."""
        return len(self._native)

    def __len__(self) -> int:
        """Samples this rank gets in the current epoch (from the resume point)."""
        return self._native.per_rank(self._start, self.world_size)

    @property
    def shared_memory_in_use(self) -> int:
        """Bytes of the shared sample region in use now (``zero_copy`` samples from DataLoader workers, held
        anywhere); 0 without one."""
        return self._native.shared_memory_in_use

    def shared_memory_held(self) -> list[dict[str, Any]]:
        """The slots of the shared sample region in use now, one dict each: ``bytes``, ``producer`` (the pid of
        the DataLoader worker that read the sample), ``producer_gone`` (exited: its share is freed by the next
        allocation or ``shared_memory_in_use``), ``producer_refs`` and ``adopted_refs`` (references held by the
        worker or its unread messages, and by processes that received the sample). For finding what holds the
        region."""
        keys = ("bytes", "producer", "producer_gone", "producer_refs", "adopted_refs")
        return [dict(zip(keys, h)) for h in self._native._shared_memory_held()]

    @property
    def source_kind(self) -> str:
        """``"agent"`` or ``"local"``: where bytes come from."""
        return self._native.source_kind

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning (unless it is the epoch a loaded state resumes)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._start = 0
            self._consumed = 0

    # -- iteration -----------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict]:
        worker, workers, info = 0, 1, None
        if _tud is not None:
            info = _tud.get_worker_info()
            if info is not None:
                worker, workers = info.id, info.num_workers
        it = self._native.iter(
            self.epoch,
            self._start,
            self.rank,
            self.world_size,
            worker,
            workers,
            self.batch_size,
            self.zero_copy,
            dataloader_worker=info is not None,
        )
        self._iter = it
        in_process = workers == 1 and worker == 0
        shared_copies = it.shared_copies
        self._iterations = getattr(self, "_iterations", 0) + 1
        reporter = _claim.StallReporter(f"epoch{self.epoch}-worker{worker}-it{self._iterations}")
        n = 0
        try:
            for sample in it:
                n += 1
                if reporter.enabled and n % 256 == 0:
                    reporter.maybe(float(it.stats().get("stall_seconds", 0.0)))
                if in_process:
                    self._consumed += 1
                if shared_copies:
                    d, shared = sample
                    sample = _SharedSample(d)
                    sample._shared = shared
                yield sample
        finally:
            self._last_stats = dict(it.stats())
            it.close()
            reporter.final(float(self._last_stats.get("stall_seconds", 0.0)))

    def stats(self) -> dict:
        """Counters of the current (or last) iteration in this process: samples, bytes, stall_seconds (time
        the loop waited for data: the I/O stall), skipped."""
        if self._iter is not None:
            live = dict(self._iter.stats())
            if live:
                return live
        return dict(self._last_stats)

    # -- resumption ----------------------------------------------------------------------------------------
    def state_dict(self, consumed: Optional[int] = None) -> dict:
        """The resume point after this rank consumed `consumed` samples of the current epoch (default: what
        this process iterated). All ranks consume the same number per step, so the global position is
        ``start + consumed * world_size``."""
        k = self._consumed if consumed is None else int(consumed)
        if k < 0:
            raise _native.InvalidInputError("consumed must be non-negative")
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "sample_in_epoch": min(self._start + k * self.world_size, self.num_samples),
            "num_samples": self.num_samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at a state from :meth:`state_dict`, with this dataset's (possibly different) world size."""
        if state.get("version") != STATE_VERSION:
            raise _native.InvalidInputError(f"state version {state.get('version')!r}; expected {STATE_VERSION}")
        for k in ("num_samples", "seed", "shuffle", "shuffle_window"):
            mine = self.num_samples if k == "num_samples" else getattr(self, k)
            if state.get(k) != mine:
                raise _native.InvalidInputError(
                    f"state was saved with {k}={state.get(k)!r}, this dataset has {mine!r}: the order would differ"
                )
        pos = int(state["sample_in_epoch"])
        if not 0 <= pos <= self.num_samples:
            raise _native.InvalidInputError(f"sample_in_epoch {pos} is outside the epoch")
        self.epoch = int(state["epoch"])
        self._start = pos
        self._consumed = 0

    def locate(self, position: int, epoch: Optional[int] = None) -> tuple[str, int]:
        """``(shard, index in shard)`` of global `position` in `epoch` (default: the current one)."""
        return self._native.locate(self.epoch if epoch is None else epoch, position)
