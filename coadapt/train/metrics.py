"""The job → controller metrics channel (profiles, φ, chosen batch, loss, progress).

Training must never wait for, or die because of, the metrics endpoint: records go into a
bounded queue drained by one daemon thread, which POSTs JSON to ``COADAPT_METRICS_URL`` or
appends JSON lines to a file. When the queue is full the newest record is dropped and counted.
``emit`` is O(1) on the training thread (a tuple into the queue); building the record, JSON
encoding and I/O all happen on the drain thread, which keeps the file open and writes what
has queued up in one go.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

_STOP = object()


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


class MetricsSink:
    """Non-blocking writer of metric records to an HTTP endpoint or a JSON-lines file."""

    def __init__(
        self,
        url: str | None = None,
        path: str | Path | None = None,
        maxsize: int = 1000,
        timeout_s: float = 2.0,
        base: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.path = Path(path) if path is not None else None
        self.timeout_s = timeout_s
        self.base = dict(base or {})
        self.dropped = 0
        self.failed = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None
        if url is not None or self.path is not None:
            self._thread = threading.Thread(target=self._drain, name="coadapt-metrics", daemon=True)
            self._thread.start()

    def emit(self, kind: str, **fields: Any) -> None:
        """Queue one record; never blocks and never raises."""
        if self._thread is None:
            return
        try:
            self._queue.put_nowait((kind, time.time(), fields))
        except queue.Full:
            self.dropped += 1

    def _encode(self, item: tuple[str, float, dict[str, Any]]) -> str:
        kind, when, fields = item
        record = {**self.base, "kind": kind, "time": when, **fields}
        return json.dumps(_jsonable(record), allow_nan=False)

    def _post(self, data: str) -> None:
        if self.url is None:
            return
        req = urllib.request.Request(
            self.url,
            data=data.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            resp.read()

    def _drain(self) -> None:
        fh: IO[str] | None = None
        try:
            while True:
                items = [self._queue.get()]
                while True:  # take everything already queued: one write and flush for all
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                lines = []
                for item in items:
                    if item is _STOP:
                        continue
                    try:
                        data = self._encode(item)
                        if self.url is not None:
                            self._post(data)
                        else:
                            lines.append(data + "\n")
                    except Exception:  # the channel is best effort: count and carry on
                        self.failed += 1
                if lines and self.path is not None:
                    try:
                        if fh is None:
                            fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
                        fh.write("".join(lines))
                        fh.flush()
                    except Exception:
                        self.failed += len(lines)
                for _ in items:
                    self._queue.task_done()
                if any(item is _STOP for item in items):
                    return
        finally:
            if fh is not None:
                fh.close()

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued (bounded by ``timeout_s``) and stop the thread."""
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self._queue.put(_STOP, timeout=max(deadline - time.monotonic(), 0.01))
                break
            except queue.Full:
                continue
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        self._thread = None
