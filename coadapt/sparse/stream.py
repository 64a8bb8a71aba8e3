"""Sample streams for online training, with offsets that make a restart exactly-once.

Contract (every :class:`StreamSource`):

* ``read(max_n, timeout)`` returns up to ``max_n`` records (``bytes``, one sample each, no
  trailing newline) in stream order. It waits at most ``timeout`` seconds for the *first*
  record and returns as soon as any are available; ``[]`` means nothing arrived in time.
* ``offset()`` is an opaque ``str`` naming the position just after the last record returned.
  It is plain text (JSON) so a checkpoint can store it next to the model.
* A source built with ``offset=saved`` (or after ``seek(saved)``) continues with the record
  right after the one ``saved`` was taken at.

Exactly-once: the trainer calls ``offset()`` after it has applied the records it read and
writes that offset **in the same atomic checkpoint** as the model (one file renamed into place,
or one database transaction). After a crash it reloads the checkpoint and builds the source
from the stored offset: records applied before the checkpoint are never read again and records
read after it (whose updates were lost with the process) are read again. Storing the offset
anywhere else — before the model, or separately — gives at-least-once or at-most-once.

Sources: :class:`FileTailSource` (the embedded default: a growing file, ``tail -f``
semantics), :class:`NatsJetStreamSource` (NATS JetStream; offset = stream sequence) and
:class:`RedisStreamSource` (Redis Streams; offset = entry id). Each has a producer used by
tests and benchmarks. The broker clients (``nats-py``, ``redis``) are the optional extra
``coadapt[stream]``; they are imported only when a broker source is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "FileProducer",
    "FileTailSource",
    "NatsJetStreamProducer",
    "NatsJetStreamSource",
    "RedisStreamProducer",
    "RedisStreamSource",
    "StreamError",
    "StreamSource",
]

T = TypeVar("T")


class StreamError(RuntimeError):
    """The stream cannot continue from where the consumer is (truncation, rotation, bad offset)."""


@runtime_checkable
class StreamSource(Protocol):
    """What an online trainer reads samples from; see the module docstring for the contract."""

    def read(self, max_n: int, timeout: float = 0.0) -> list[bytes]:
        """Up to ``max_n`` records; waits at most ``timeout`` s for the first one."""
        ...

    def offset(self) -> str:
        """Position after the last record returned, to store atomically with the model."""
        ...

    def seek(self, offset: str) -> None:
        """Continue after the record at which ``offset`` was taken."""
        ...

    def close(self) -> None:
        """Release connections and files."""
        ...


def _check_read_args(max_n: int, timeout: float) -> None:
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")


def _parse_offset(offset: str, kind: str, keys: tuple[str, ...]) -> dict[str, Any]:
    try:
        data = json.loads(offset)
    except (TypeError, ValueError) as exc:
        raise StreamError(f"{kind} offset must be the JSON text offset() returned: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != kind or any(k not in data for k in keys):
        raise StreamError(
            f"offset {offset!r} is not a {kind} offset (expected keys kind={kind!r}, "
            f"{', '.join(keys)}); was it saved from another kind of source?"
        )
    return data


# --------------------------------------------------------------------------- growing file


class FileTailSource:
    """Records are the lines of a file that another process keeps appending to.

    The offset is the byte position after the last whole line returned (plus the file's inode,
    to notice a different file). A partial last line — the writer is mid-``write`` — is not
    returned until its newline arrives. Empty lines carry no sample and are skipped.

    Rotation is not followed: if the file is truncated below the offset, or the path is renamed
    away and recreated, ``read`` raises :class:`StreamError` once the old file is drained,
    instead of silently skipping or re-reading samples. Start a new source on the new file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: str | None = None,
        *,
        chunk_bytes: int = 1 << 20,
        poll_interval: float = 0.02,
        check_identity: bool = True,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.path = os.fspath(path)
        self.chunk_bytes = chunk_bytes
        self.poll_interval = poll_interval
        self.check_identity = check_identity
        self._clock, self._sleep = clock, sleep
        self._fh: Any = None
        self._ino: int | None = None
        self._pos = 0  # file position after the last line returned
        self._buf = b""  # bytes read from the file after _pos, not yet returned
        if offset is not None:
            self.seek(offset)

    def offset(self) -> str:
        return json.dumps({"kind": "file", "pos": self._pos, "ino": self._ino})

    def seek(self, offset: str) -> None:
        data = _parse_offset(offset, "file", ("pos",))
        pos, ino = data["pos"], data.get("ino")
        if not isinstance(pos, int) or pos < 0:
            raise StreamError(f"file offset position must be an integer >= 0, got {pos!r}")
        self._close_fh()
        self._pos, self._ino, self._buf = pos, ino, b""
        self._open()

    def read(self, max_n: int, timeout: float = 0.0) -> list[bytes]:
        _check_read_args(max_n, timeout)
        deadline = self._clock() + timeout
        while True:
            out = self._take(max_n)
            if out:
                return out
            if self._fill():
                continue
            if self._clock() >= deadline:
                return []
            self._sleep(min(self.poll_interval, max(0.0, deadline - self._clock())))

    def close(self) -> None:
        self._close_fh()

    def _take(self, max_n: int) -> list[bytes]:
        out: list[bytes] = []
        start = 0
        buf = self._buf
        while len(out) < max_n:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = buf[start:nl]
            start = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line:
                out.append(line)
        self._pos += start
        self._buf = buf[start:]
        return out

    def _fill(self) -> bool:
        """Read more bytes; False when there are none yet. Raises on truncation/rotation."""
        if self._fh is None and not self._open():
            return False
        data = self._fh.read(self.chunk_bytes)
        if data:
            self._buf += data
            return True
        size = os.fstat(self._fh.fileno()).st_size
        if size < self._pos + len(self._buf):
            raise StreamError(
                f"{self.path} shrank to {size} bytes, below the consumer's position "
                f"{self._pos + len(self._buf)}: it was truncated; rotation is not followed — "
                "start a new FileTailSource on the new file"
            )
        try:
            now = os.stat(self.path).st_ino
        except FileNotFoundError:
            now = None
        if now != self._ino:
            raise StreamError(
                f"{self.path} was rotated (renamed or replaced) and the old file is fully read; "
                "rotation is not followed — start a new FileTailSource on the new file"
            )
        return False

    def _open(self) -> bool:
        try:
            fh = open(self.path, "rb")  # noqa: SIM115 - kept open across reads
        except FileNotFoundError:
            return False
        ino = os.fstat(fh.fileno()).st_ino
        if self._ino is not None and ino != self._ino and self.check_identity:
            fh.close()
            raise StreamError(
                f"{self.path} is not the file this offset was saved from (inode {ino}, offset "
                f"says {self._ino}); if it was restored from a copy, pass check_identity=False"
            )
        size = os.fstat(fh.fileno()).st_size
        if size < self._pos:
            fh.close()
            raise StreamError(
                f"{self.path} has {size} bytes but the offset is at byte {self._pos}: wrong file "
                "or truncated"
            )
        fh.seek(self._pos)
        self._fh, self._ino = fh, ino
        return True

    def _close_fh(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class FileProducer:
    """Appends records as lines (tests, benchmarks, and a simple local feed)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync

    def publish(self, records: Iterable[bytes]) -> int:
        """Append records; returns how many. A record must not contain a newline."""
        recs = list(records)
        for r in recs:
            if b"\n" in r:
                raise ValueError("a record must not contain a newline (one sample per line)")
        with open(self.path, "ab") as fh:
            fh.write(b"".join(r + b"\n" for r in recs))
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        return len(recs)


# --------------------------------------------------------------------------- NATS JetStream


class _LoopThread:
    """A private asyncio loop in a daemon thread, so sync callers can drive an async client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _nats() -> Any:
    try:
        import nats
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "NATS JetStream sources need the nats-py client: pip install 'coadapt[stream]'"
        ) from exc
    return nats


class _NatsBase:
    def __init__(self, servers: str, connect_timeout: float) -> None:
        nats = _nats()
        self._lt = _LoopThread()
        self._timeout = connect_timeout
        try:
            self._nc = self._lt.run(
                nats.connect(
                    servers,
                    connect_timeout=connect_timeout,
                    max_reconnect_attempts=2,
                    allow_reconnect=False,
                ),
                connect_timeout + 5,
            )
        except BaseException:
            self._lt.close()
            raise
        self._js = self._nc.jetstream()

    def close(self) -> None:
        if self._lt.loop.is_closed():
            return
        try:
            self._lt.run(self._nc.close(), self._timeout + 5)
        finally:
            self._lt.close()


class NatsJetStreamSource(_NatsBase):
    """Ordered pull consumer on a JetStream stream; the offset is the last stream sequence read.

    Each source creates its own ephemeral consumer (no server-side ack state: ``ack_policy``
    none) that starts at ``offset + 1`` and is deleted on ``close``/``seek``; if the process
    dies, the server drops it after ``inactive_threshold`` seconds.
    """

    def __init__(
        self,
        stream: str,
        subject: str,
        offset: str | None = None,
        *,
        servers: str = "nats://127.0.0.1:4222",
        connect_timeout: float = 5.0,
        inactive_threshold: float = 300.0,
    ) -> None:
        self.stream, self.subject = stream, subject
        self.inactive_threshold = inactive_threshold
        self._seq = 0
        self._sub: Any = None
        self._consumer: str | None = None
        super().__init__(servers, connect_timeout)
        try:
            if offset is not None:
                self._seq = self._parse(offset)
            self._lt.run(self._subscribe(), connect_timeout + 5)
        except BaseException:
            super().close()
            raise

    def offset(self) -> str:
        return json.dumps({"kind": "nats", "stream": self.stream, "seq": self._seq})

    def seek(self, offset: str) -> None:
        seq = self._parse(offset)
        self._lt.run(self._unsubscribe(), self._timeout + 5)
        self._seq = seq
        self._lt.run(self._subscribe(), self._timeout + 5)

    def read(self, max_n: int, timeout: float = 0.0) -> list[bytes]:
        _check_read_args(max_n, timeout)
        msgs = self._lt.run(self._fetch(max_n, timeout), timeout + self._timeout + 5)
        out = []
        for m in msgs:
            seq = m.metadata.sequence.stream
            if seq <= self._seq:  # never hand back what was already returned
                continue
            self._seq = seq
            out.append(bytes(m.data))
        return out

    def close(self) -> None:
        if not self._lt.loop.is_closed():
            try:
                self._lt.run(self._unsubscribe(), self._timeout + 5)
            finally:
                super().close()

    def _parse(self, offset: str) -> int:
        data = _parse_offset(offset, "nats", ("seq", "stream"))
        if data["stream"] != self.stream:
            raise StreamError(
                f"offset belongs to stream {data['stream']!r}, this source reads {self.stream!r}"
            )
        seq = data["seq"]
        if not isinstance(seq, int) or seq < 0:
            raise StreamError(f"nats offset sequence must be an integer >= 0, got {seq!r}")
        return seq

    async def _subscribe(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self._seq + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=self.inactive_threshold,
        )
        self._sub = await self._js.pull_subscribe(self.subject, stream=self.stream, config=cfg)
        self._consumer = (await self._sub.consumer_info()).name

    async def _unsubscribe(self) -> None:
        if self._sub is None:
            return
        sub, name = self._sub, self._consumer
        self._sub = self._consumer = None
        await sub.unsubscribe()
        if name is not None:
            # Already gone (inactive threshold) means there is nothing left to release.
            with contextlib.suppress(Exception):
                await self._js.delete_consumer(self.stream, name)

    async def _fetch(self, max_n: int, timeout: float) -> list[Any]:
        # nats-py raises its own TimeoutError when nothing came, but a bare asyncio one when
        # the deadline passed between its two pull requests (a loaded machine). Both mean
        # "nothing yet": what a late reply delivers waits in the subscription's queue, and the
        # next fetch drains that queue first, in order.
        try:
            msgs: list[Any] = await self._sub.fetch(max_n, timeout=max(timeout, 0.001))
        except asyncio.TimeoutError:  # nats.errors.TimeoutError is a subclass
            return []
        return msgs


class NatsJetStreamProducer(_NatsBase):
    """Publishes records to a subject, creating the stream (file storage) if it is missing."""

    def __init__(
        self,
        stream: str,
        subject: str,
        *,
        servers: str = "nats://127.0.0.1:4222",
        connect_timeout: float = 5.0,
        create: bool = True,
    ) -> None:
        self.stream, self.subject = stream, subject
        super().__init__(servers, connect_timeout)
        if create:
            try:
                self._lt.run(self._ensure_stream(), connect_timeout + 5)
            except BaseException:
                super().close()
                raise

    async def _ensure_stream(self) -> None:
        import nats.js.errors

        try:
            await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(name=self.stream, subjects=[self.subject])

    def publish(self, records: Iterable[bytes]) -> int:
        """Publish in order and wait for the acks; returns the last stream sequence (0: none)."""
        recs = list(records)
        return self._lt.run(self._publish(recs), self._timeout + 5 + len(recs) / 1000)

    async def _publish(self, recs: list[bytes]) -> int:
        futures = [await self._js.publish_async(self.subject, r, stream=self.stream) for r in recs]
        acks = await asyncio.gather(*futures)
        return int(acks[-1].seq) if acks else 0

    def delete_stream(self) -> None:
        """Remove the stream and its messages (tests clean up with this)."""
        self._lt.run(self._js.delete_stream(self.stream), self._timeout + 5)


# --------------------------------------------------------------------------- Redis Streams

_REDIS_FIELD = b"d"


def _redis(url: str) -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "Redis Streams sources need the redis client: pip install 'coadapt[stream]'"
        ) from exc
    return redis.Redis.from_url(url, socket_connect_timeout=5)


class RedisStreamSource:
    """Reads a Redis Stream with ``XREAD``; the offset is the last entry id returned.

    No consumer group: the position lives only in the offset, which is what makes storing it
    with the checkpoint sufficient (a group's server-side cursor would move on its own).
    """

    def __init__(
        self, key: str, offset: str | None = None, *, url: str = "redis://127.0.0.1:6379/0"
    ) -> None:
        self.key = key
        self._r = _redis(url)
        self._last = "0-0"
        if offset is not None:
            self.seek(offset)

    def offset(self) -> str:
        return json.dumps({"kind": "redis", "key": self.key, "id": self._last})

    def seek(self, offset: str) -> None:
        data = _parse_offset(offset, "redis", ("key", "id"))
        if data["key"] != self.key:
            raise StreamError(
                f"offset belongs to key {data['key']!r}, this source reads {self.key!r}"
            )
        entry = data["id"]
        parts = entry.split("-") if isinstance(entry, str) else []
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise StreamError(f"redis offset id must look like '<ms>-<seq>', got {entry!r}")
        self._last = entry

    def read(self, max_n: int, timeout: float = 0.0) -> list[bytes]:
        _check_read_args(max_n, timeout)
        block = int(timeout * 1000) if timeout > 0 else None
        if block == 0:
            block = 1  # BLOCK 0 would mean "forever"
        resp = self._r.xread({self.key: self._last}, count=max_n, block=block)
        out: list[bytes] = []
        for _key, entries in resp or []:
            for entry_id, fields in entries:
                if _REDIS_FIELD not in fields:
                    raise StreamError(
                        f"entry {entry_id!r} of {self.key!r} has no field {_REDIS_FIELD!r}; "
                        "publish with RedisStreamProducer (XADD key * d <record>)"
                    )
                out.append(bytes(fields[_REDIS_FIELD]))
                self._last = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return out

    def close(self) -> None:
        self._r.close()


class RedisStreamProducer:
    """Appends records with ``XADD`` in one pipeline per call."""

    def __init__(self, key: str, *, url: str = "redis://127.0.0.1:6379/0") -> None:
        self.key = key
        self._r = _redis(url)

    def publish(self, records: Iterable[bytes]) -> int:
        """Append records in order; returns how many."""
        pipe = self._r.pipeline(transaction=False)
        n = 0
        for rec in records:
            pipe.xadd(self.key, {_REDIS_FIELD: rec})
            n += 1
        pipe.execute()
        return n

    def delete_stream(self) -> None:
        self._r.delete(self.key)

    def close(self) -> None:
        self._r.close()
