"""The job → controller metrics channel (profiles, φ, chosen batch, loss, progress).

Training must never wait for, or die because of, the metrics endpoint: records are handed to
one daemon thread, which POSTs JSON to the replica's metrics URL (over one kept-alive
connection) or appends JSON lines to a file. ``emit`` is O(1) on the training thread (a typed
:mod:`coadapt.protocol` record into a buffer); JSON encoding and I/O happen on the drain
thread.

Two kinds of record, because they fail differently under load:

- *state* records (``progress``, ``goodput``: the job's latest figures, each superseding the
  last) are coalesced: the channel keeps only the newest of each kind and sends it at most
  every ``state_interval`` seconds, and always at :meth:`MetricsSink.close`. However fast the
  job steps and however slow the controller, the last step reaches it (a FIFO of every
  record fell behind a busy controller, dropped the newest records when full and lost the
  backlog at exit: a finished job showed step 6420 while its log reached 8100). A state
  record that fails to send is kept for the next try unless a newer one replaced it.
- *event* records (``metric``, ``batch``, ``first_step``, ``stopped``...) are each sent, in
  order, promptly; when their bounded queue is full the newest is dropped and counted.

Records of both kinds go out in the order they were emitted. :meth:`close` runs at
interpreter exit too (``atexit``), so a script that never calls ``ct.shutdown()`` still sends
its final figures.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import threading
import time
import weakref
from collections import deque
from pathlib import Path
from typing import IO, Any

import httpx

from coadapt.protocol import STATE_KINDS, MetricRecord

_Item = tuple[int, str, float, MetricRecord]  # (sequence, kind, time, record)


def _jsonable(value: Any) -> Any:
    """Make numbers JSON-safe (NaN/inf become null) and tensors/arrays plain values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _close_at_exit(ref: weakref.ref[MetricsSink]) -> None:
    sink = ref()
    if sink is not None:
        sink.close()


class MetricsSink:
    """Non-blocking writer of metric records to an HTTP endpoint or a JSON-lines file."""

    def __init__(
        self,
        url: str | None = None,
        path: str | Path | None = None,
        maxsize: int = 1000,
        timeout_s: float = 2.0,
        base: dict[str, Any] | None = None,
        state_interval: float = 0.5,
    ) -> None:
        self.url = url
        self.path = Path(path) if path is not None else None
        self.timeout_s = timeout_s
        self.base = dict(base or {})
        self.state_interval = state_interval
        self.maxsize = maxsize
        self.dropped = 0
        self.failed = 0
        self.sent = 0
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._events: deque[_Item] = deque()
        self._latest: dict[str, _Item] = {}
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None  # the drain thread's only
        if url is not None or self.path is not None:
            self._thread = threading.Thread(target=self._drain, name="coadapt-metrics", daemon=True)
            self._thread.start()
            atexit.register(_close_at_exit, weakref.ref(self))

    def emit(self, record: MetricRecord) -> None:
        """Queue one record; never blocks and never raises."""
        if self._thread is None:
            return
        kind = record.kind.value
        item = (next(self._seq), kind, time.time(), record)
        with self._lock:
            if kind in STATE_KINDS:
                self._latest[kind] = item  # supersedes the unsent one: nothing to wake for
                return
            if len(self._events) >= self.maxsize:
                self.dropped += 1
                return
            self._events.append(item)
        self._wake.set()

    def _encode(self, item: _Item) -> str:
        _, kind, when, record = item
        fields = record.to_json()
        fields.pop("time", None)
        out = {**self.base, "kind": kind, "time": when, **fields}
        return json.dumps(_jsonable(out), allow_nan=False)

    def _post(self, data: str) -> None:
        """POST one record over the drain thread's kept-alive connection (a new TCP and, on
        https, TLS handshake per record capped the rate a busy controller could be fed)."""
        if self.url is None:
            return
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        resp = self._client.post(
            self.url, content=data.encode(), headers={"Content-Type": "application/json"}
        )
        resp.raise_for_status()

    def _take(self, with_states: bool) -> list[_Item]:
        """Everything queued (and the latest states if due), in emission order."""
        with self._lock:
            items = list(self._events)
            self._events.clear()
            if with_states:
                items += self._latest.values()
                self._latest.clear()
        return sorted(items)

    def _requeue_state(self, item: _Item) -> None:
        with self._lock:
            newer = self._latest.get(item[1])
            if newer is None or newer[0] < item[0]:
                self._latest[item[1]] = item

    def _drain(self) -> None:
        fh: IO[str] | None = None
        next_state = time.monotonic()
        try:
            while True:
                self._wake.wait(self.state_interval)
                self._wake.clear()
                closing = self._closing
                states_due = closing or time.monotonic() >= next_state
                items = self._take(states_due)
                if states_due:
                    next_state = time.monotonic() + self.state_interval
                lines = []
                for item in items:
                    try:
                        data = self._encode(item)
                        if self.url is not None:
                            self._post(data)
                            self.sent += 1
                        else:
                            lines.append(data + "\n")
                    except Exception:  # the channel is best effort: count and carry on
                        self.failed += 1
                        if item[1] in STATE_KINDS and not closing:
                            self._requeue_state(item)
                if lines and self.path is not None:
                    try:
                        if fh is None:
                            fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                        fh.write("".join(lines))
                        fh.flush()
                        self.sent += len(lines)
                    except Exception:
                        self.failed += len(lines)
                if closing:
                    with self._lock:
                        if not self._events and not self._latest:
                            return
        finally:
            if fh is not None:
                fh.close()
            if self._client is not None:
                self._client.close()
                self._client = None

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is pending (bounded by ``timeout_s``) and stop the thread."""
        thread = self._thread
        if thread is None:
            return
        self._closing = True
        self._wake.set()
        thread.join(timeout_s)
        self._thread = None
