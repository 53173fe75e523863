"""This process's I/O stall, reported to the job's claim with its heartbeat.

A job started for a claim has ``STRATA_CLAIM`` and ``STRATA_AGENT`` in its environment (``STRATA_TOKEN`` to
authenticate). Each iteration of a :class:`strata.StreamingDataset` then sends its running total of stall
seconds under a name of its own (``host:pid:label``) every 30 seconds, from a background thread so training
never waits on it, and once more when the iteration ends. The agent keeps the largest total per name and sums
them into the claim's accounting (``usage.stall_secs``), so a repeated report counts once.

A report that fails (the agent away, the claim already released) is not an error of the training loop: the
first failure is a warning, the rest are silent.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
import warnings
from typing import Optional

EVERY_SECS = 30.0


class StallReporter:
    """Reports of one iteration's stall to ``STRATA_CLAIM`` (does nothing without one)."""

    def __init__(self, label: str) -> None:
        self.claim: Optional[str] = os.environ.get("STRATA_CLAIM") or None
        self.agent: Optional[str] = (os.environ.get("STRATA_AGENT") or "").rstrip("/") or None
        self.token: Optional[str] = os.environ.get("STRATA_TOKEN") or None
        self.reporter = f"{socket.gethostname()}:{os.getpid()}:{label}"
        self.enabled = bool(self.claim and self.agent)
        self._last = time.monotonic()
        self._busy = threading.Lock()
        self._warned = False

    def maybe(self, stall_secs: float) -> None:
        """Report in the background if the last report is old enough and none is in flight."""
        if not self.enabled or time.monotonic() - self._last < EVERY_SECS:
            return
        if not self._busy.acquire(blocking=False):
            return
        self._last = time.monotonic()
        threading.Thread(target=self._send_then_release, args=(stall_secs,), daemon=True).start()

    def final(self, stall_secs: float) -> None:
        """Report the iteration's last total (waits for one in flight, then at most 5 s)."""
        if not self.enabled:
            return
        with self._busy:
            self._send(stall_secs)

    def _send_then_release(self, stall_secs: float) -> None:
        try:
            self._send(stall_secs)
        finally:
            self._busy.release()

    def _send(self, stall_secs: float) -> None:
        body = json.dumps({"stall_secs": round(max(0.0, float(stall_secs)), 3), "reporter": self.reporter})
        url = f"{self.agent}/v1/claims/{urllib.parse.quote(str(self.claim), safe='')}/heartbeat"
        req = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()
        except Exception as e:  # noqa: BLE001 - accounting must never stop training
            if not self._warned:
                self._warned = True
                warnings.warn(f"strata: reporting I/O stall to claim {self.claim} at {self.agent} failed: {e}",
                              RuntimeWarning, stacklevel=2)
