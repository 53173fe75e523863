"""Strata: the AI data layer, from Python.

- :class:`StreamingDataset`: stream WebDataset tar or MosaicML MDS shards from ``s3://``, ``file://`` or a local
  directory into a training loop, in a deterministic order that can be resumed with a different world size.
- :func:`index_dataset`: write a ``strata-manifest.json`` so jobs start without listing or scanning shards.
- :class:`Checkpointer`: asynchronous sharded checkpoints, local tier then object store, verified restore.
- :func:`metrics_text`: this process's metrics (loader samples and I/O stall time per rank) in Prometheus format.
- Errors: :class:`StrataError` and one subclass per error kind of the Rust core (``NotFoundError``,
  ``CorruptDataError``, ``UnavailableError``, ``ResourceExhaustedError``, ...); every instance has ``kind``
  (the kind's name, as on the agent's wire) and ``retryable``.

The bytes are moved and decoded by Strata's Rust core with the GIL released. When a Strata agent
(``strata serve``) runs on the node and ``STRATA_AGENT`` names its API address, every rank reads through the
agent's shared cache; otherwise each process uses an in-process cache.
"""

from strata._native import (
    Buffer,
    AlreadyExistsError,
    ChangedError,
    ConfigError,
    CorruptDataError,
    InternalError,
    InvalidInputError,
    InvalidRangeError,
    NoSpaceError,
    NotFoundError,
    OperationCancelledError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StorageIOError,
    StrataError,
    TimedOutError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedError,
    index_dataset,
    metrics_text,
)
from strata.checkpoint import Checkpointer, SaveHandle
from strata.dataset import StreamingDataset

__all__ = [
    "StreamingDataset",
    "Buffer",
    "Checkpointer",
    "SaveHandle",
    "index_dataset",
    "metrics_text",
    "StrataError",
    "NotFoundError",
    "AlreadyExistsError",
    "ChangedError",
    "InvalidInputError",
    "ConfigError",
    "InvalidRangeError",
    "PermissionDeniedError",
    "UnauthenticatedError",
    "UnavailableError",
    "TimedOutError",
    "StorageIOError",
    "NoSpaceError",
    "CorruptDataError",
    "UnsupportedError",
    "OperationCancelledError",
    "ResourceExhaustedError",
    "InternalError",
]
