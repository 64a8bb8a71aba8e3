from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coadapt.sparse.stream import (
    FileProducer,
    FileTailSource,
    StreamError,
    StreamSource,
)
from tests.requirements import unavailable


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _records(n: int, start: int = 0) -> list[bytes]:
    return [f"sample-{i}\t{i * 7 % 13}".encode() for i in range(start, start + n)]


def _exactly_once(
    make_source: Callable[[str | None], StreamSource], publish: Callable[[list[bytes]], object]
) -> None:
    """Produce N, apply k and checkpoint, read more without committing, crash, resume."""
    produced = _records(120)
    publish(produced[:80])
    applied: list[bytes] = []
    src = make_source(None)
    while len(applied) < 35:
        applied += src.read(min(7, 35 - len(applied)), timeout=2.0)
    checkpoint = src.offset()  # stored atomically with the model
    lost = src.read(10, timeout=2.0)  # read but never committed: its updates die with the process
    assert lost == produced[35:45]
    src.close()  # the crash: the consumer object and everything it held are gone
    publish(produced[80:])
    resumed = make_source(checkpoint)
    deadline = time.monotonic() + 20
    while len(applied) < len(produced) and time.monotonic() < deadline:
        applied += resumed.read(50, timeout=0.5)
    assert resumed.read(10, timeout=0.2) == []
    resumed.close()
    assert applied == produced  # every sample once, in order


# --------------------------------------------------------------------------- file


def test_file_source_resumes_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    prod = FileProducer(path)
    _exactly_once(lambda off: FileTailSource(path, off), lambda recs: prod.publish(recs) and None)


def test_file_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    src = FileTailSource(path)
    assert src.read(5) == []  # the file does not exist yet
    with open(path, "ab") as fh:
        fh.write(b"one\n\ntw")
    assert src.read(5) == [b"one"]
    before = src.offset()
    assert src.read(5, timeout=0.05) == []
    assert src.offset() == before
    with open(path, "ab") as fh:
        fh.write(b"o\r\nthree\n")
    assert src.read(5) == [b"two", b"three"]
    src.close()
    again = FileTailSource(path, before)
    assert again.read(5) == [b"two", b"three"]
    again.close()


def test_file_source_with_a_concurrent_writer(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    path.write_bytes(b"")
    expected = _records(3000)
    blob = b"".join(r + b"\n" for r in expected)

    def writer() -> None:  # writes in odd-sized pieces, so lines are split mid-record
        with open(path, "ab") as fh:
            for i in range(0, len(blob), 997):
                fh.write(blob[i : i + 997])
                fh.flush()
                time.sleep(0.0005)

    t = threading.Thread(target=writer)
    got: list[bytes] = []
    src = FileTailSource(path, chunk_bytes=4096)
    t.start()
    deadline = time.monotonic() + 20
    offsets = []
    while len(got) < len(expected) and time.monotonic() < deadline:
        got += src.read(64, timeout=0.2)
        offsets.append(src.offset())
    t.join()
    src.close()
    assert got == expected
    # A source rebuilt from any intermediate offset continues with the right record.
    mid = offsets[len(offsets) // 2]
    seen = FileTailSource(path, mid)
    n_before = int(mid.split('"pos": ')[1].split(",")[0])
    assert blob[:n_before].count(b"\n") < len(expected)
    assert seen.read(1) == [expected[blob[:n_before].count(b"\n")]]
    seen.close()


def test_file_truncation_rotation_and_bad_offsets_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.txt"
    FileProducer(path).publish(_records(5))
    src = FileTailSource(path)
    assert len(src.read(10)) == 5
    off = src.offset()
    path.write_bytes(b"x\n")  # truncated in place
    with pytest.raises(StreamError, match="shrank"):
        src.read(1)
    src.close()
    FileProducer(path).publish(_records(5))
    src = FileTailSource(path)
    src.read(10)
    os.rename(path, tmp_path / "s.txt.1")
    FileProducer(path).publish(_records(2))
    with pytest.raises(StreamError, match="rotated"):
        src.read(1)
    src.close()
    with pytest.raises(StreamError, match="not the file this offset was saved from"):
        FileTailSource(path, off)
    with pytest.raises(StreamError, match="not a file offset"):
        FileTailSource(path, '{"kind": "redis", "key": "k", "id": "0-0"}')
    with pytest.raises(StreamError, match="JSON"):
        FileTailSource(path, "pos=12")
    with pytest.raises(ValueError, match="max_n"):
        FileTailSource(path).read(0)
    with pytest.raises(ValueError, match="newline"):
        FileProducer(path).publish([b"a\nb"])


# --------------------------------------------------------------------------- NATS JetStream


@pytest.fixture
def nats_stream() -> Iterator[tuple[str, str]]:
    if not _port_open(4222):
        unavailable("NATS JetStream is not answering on 127.0.0.1:4222 (.ci/services.sh)")
    try:
        import nats  # noqa: F401
    except ImportError:
        unavailable("nats-py is not installed (pip install -e '.[stream]')")
    from coadapt.sparse.stream import NatsJetStreamProducer

    name = f"coadapt_test_{uuid.uuid4().hex[:10]}"
    prod = NatsJetStreamProducer(name, f"{name}.samples")
    try:
        yield name, f"{name}.samples"
    finally:
        prod.delete_stream()
        prod.close()


def test_nats_jetstream_resumes_exactly_once(nats_stream: tuple[str, str]) -> None:
    from coadapt.sparse.stream import NatsJetStreamProducer, NatsJetStreamSource

    stream, subject = nats_stream
    prod = NatsJetStreamProducer(stream, subject)
    try:
        _exactly_once(
            lambda off: NatsJetStreamSource(stream, subject, off),
            lambda recs: prod.publish(recs) and None,
        )
        src = NatsJetStreamSource(stream, subject)
        first = src.read(3, timeout=2)
        off = src.offset()
        src.read(5, timeout=2)
        src.seek(off)
        assert src.read(1, timeout=2) == _records(120)[3:4]
        assert first == _records(3)
        with pytest.raises(StreamError, match="belongs to stream"):
            src.seek(off.replace(stream, "other"))
        src.close()
    finally:
        prod.close()


def test_nats_a_bare_asyncio_timeout_is_an_empty_read(nats_stream: tuple[str, str]) -> None:
    """nats-py lets asyncio's own TimeoutError out when its deadline passes between its two pull
    requests (seen under load in CI); that is "nothing yet", not a failure of the source."""
    import asyncio

    from coadapt.sparse.stream import NatsJetStreamProducer, NatsJetStreamSource

    stream, subject = nats_stream
    prod = NatsJetStreamProducer(stream, subject)
    src = NatsJetStreamSource(stream, subject)
    try:
        prod.publish(_records(6))
        real_fetch = src._sub.fetch
        calls = 0

        async def late_fetch(*args: object, **kw: object) -> object:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise asyncio.TimeoutError
            return await real_fetch(*args, **kw)

        src._sub.fetch = late_fetch
        assert src.read(4, timeout=0.5) == []
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
            got += src.read(4, timeout=0.5)
        assert got == _records(6)
    finally:
        src.close()
        prod.close()


# --------------------------------------------------------------------------- Redis Streams


@pytest.fixture
def redis_key() -> Iterator[str]:
    if not _port_open(6379):
        unavailable("Redis is not answering on 127.0.0.1:6379 (.ci/services.sh)")
    try:
        import redis  # noqa: F401
    except ImportError:
        unavailable("redis is not installed (pip install -e '.[stream]')")
    from coadapt.sparse.stream import RedisStreamProducer

    key = f"coadapt:test:{uuid.uuid4().hex[:10]}"
    prod = RedisStreamProducer(key)
    try:
        yield key
    finally:
        prod.delete_stream()
        prod.close()


def test_redis_stream_resumes_exactly_once(redis_key: str) -> None:
    from coadapt.sparse.stream import RedisStreamProducer, RedisStreamSource

    prod = RedisStreamProducer(redis_key)
    try:
        _exactly_once(
            lambda off: RedisStreamSource(redis_key, off),
            lambda recs: prod.publish(recs) and None,
        )
        src = RedisStreamSource(redis_key)
        t0 = time.monotonic()
        assert len(src.read(500, timeout=0.3)) == 120
        assert src.read(5, timeout=0.3) == []
        assert time.monotonic() - t0 >= 0.25  # the empty read waited for its timeout
        with pytest.raises(StreamError, match="'<ms>-<seq>'"):
            src.seek(src.offset().replace('"id": "', '"id": "x'))
        src.close()
    finally:
        prod.close()
