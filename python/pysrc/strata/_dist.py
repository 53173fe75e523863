"""Where this process sits in a distributed job: its rank, the world size and the ranks on its node.

One set of rules for the loader and the checkpointer. Explicit arguments win; then ``RANK`` / ``WORLD_SIZE``
(torchrun, most launchers); then ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` with ``NODE_RANK`` (or ``GROUP_RANK``)
and ``NNODES`` (or ``GROUP_WORLD_SIZE``); else rank 0 of a world of 1. The node's world is
``LOCAL_WORLD_SIZE``, else the whole world (one node).
"""

from __future__ import annotations

import os
from typing import Optional

from strata import _native


def env_int(name: str) -> Optional[int]:
    """The integer in environment variable ``name``, ``None`` when it is unset or empty."""
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError as e:
        raise _native.InvalidInputError(f"environment variable {name}={v!r} is not an integer") from e


def resolve_rank(rank: Optional[int] = None, world: Optional[int] = None) -> tuple[int, int]:
    """This process's ``(rank, world_size)``; raises :class:`strata.InvalidInputError` when the rank is not in
    the world."""
    r = rank if rank is not None else env_int("RANK")
    w = world if world is not None else env_int("WORLD_SIZE")
    if r is None or w is None:
        local_rank = env_int("LOCAL_RANK")
        local_world = env_int("LOCAL_WORLD_SIZE")
        node = env_int("NODE_RANK") if env_int("NODE_RANK") is not None else env_int("GROUP_RANK")
        if local_rank is not None and local_world is not None and r is None and w is None:
            r = (node or 0) * local_world + local_rank
            w = local_world * max(1, env_int("NNODES") or env_int("GROUP_WORLD_SIZE") or 1)
    r = 0 if r is None else r
    w = 1 if w is None else w
    if w < 1 or not 0 <= r < w:
        raise _native.InvalidInputError(f"rank {r} is not in a world of {w} ranks")
    return r, w


def local_world_size(world: int, local: Optional[int] = None) -> int:
    """Ranks on this node: ``local``, else ``LOCAL_WORLD_SIZE``, else ``world`` (one node)."""
    if local is not None:
        return local
    v = env_int("LOCAL_WORLD_SIZE")
    return world if v is None else v
