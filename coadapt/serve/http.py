"""A small HTTP/1.1 server protocol for the serving hot path.

Why not uvicorn + a framework: a prediction is a few hundred microseconds of model time, and
the per-request cost of an ASGI stack (scope dicts, middleware, response objects) is of the
same order. This protocol does only what the serving API needs: request line, headers,
``Content-Length`` bodies (chunked uploads are refused with 411), keep-alive, in-order
responses, and hard limits (header size, body size) answered with a 4xx before the body is
read. Handlers are ``async (Request) -> Response``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

MAX_HEADER_BYTES = 16 * 1024
LINGER_S = 5.0  # how long an oversized body is read and dropped so the client sees the 413
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""  # what followed "?" in the request target (without it)


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def error(status: int, message: str) -> Response:
    """A JSON error body ``{"error": message}``."""
    return Response(status, json.dumps({"error": message}).encode())


class HttpProtocol(asyncio.Protocol):
    """One connection: parse requests, run the handler, write responses in order."""

    def __init__(self, handler: Handler, max_body: int) -> None:
        self._handler = handler
        self._max_body = max_body
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._busy = False
        self._closing = False
        self._discard = 0  # bytes of a refused body still to read and drop
        self._continued = False  # "100 Continue" sent for the request being received

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._discard:
            self._discard = max(0, self._discard - len(data))
            if not self._discard and self._transport is not None:
                self._transport.close()
            return
        self._buf += data
        if not self._busy:
            self._next()

    def _next(self) -> None:
        """Parse one complete request from the buffer, if there is one, and dispatch it."""
        if self._closing or self._transport is None:
            return
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEADER_BYTES:
                self._fail(431, f"request headers exceed {MAX_HEADER_BYTES} bytes")
            return
        try:
            head = bytes(self._buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            method, path, version = lines[0].split(" ")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        except ValueError:
            self._fail(400, "malformed HTTP request line or header")
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._fail(411, "chunked bodies are not accepted: send Content-Length")
            return
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            self._fail(400, "Content-Length must be a non-negative integer")
            return
        if length > self._max_body:
            # answer now, then read and drop the body (bounded in time) before closing: a
            # client that sends it all before reading would otherwise see a reset, not the 413
            resp = error(413, f"body of {length} bytes exceeds the limit of {self._max_body} "
                         "bytes: split the batch into smaller requests")  # fmt: skip
            resp.headers["Connection"] = "close"
            self._write(resp, keep=True)  # closed once the body is drained, below
            self._closing = True
            self._discard = max(1, length - (len(self._buf) - end - 4))
            self._buf.clear()
            t = self._transport
            if t is not None:
                asyncio.get_running_loop().call_later(LINGER_S, t.close)
            return
        total = end + 4 + length
        if len(self._buf) < total:
            if not self._continued and headers.get("expect", "").lower() == "100-continue":
                self._continued = True  # curl waits a second for this before a large body
                if self._transport is not None:
                    self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        self._continued = False
        body = bytes(self._buf[end + 4 : total])
        del self._buf[:total]
        conn = headers.get("connection", "").lower()
        keep = conn != "close" and (version == "HTTP/1.1" or conn == "keep-alive")
        self._busy = True
        target, _, query = path.partition("?")
        task: asyncio.Task[Response] = asyncio.get_running_loop().create_task(
            self._handler(Request(method, target, headers, body, query))
        )
        task.add_done_callback(lambda t: self._done(t, keep))

    def _done(self, task: asyncio.Task[Response], keep: bool) -> None:
        self._busy = False
        if task.cancelled():
            resp = error(503, "request cancelled: the server is stopping")
        elif task.exception() is not None:
            resp = error(500, f"internal error: {task.exception()!r}")
        else:
            resp = task.result()
        self._write(resp, keep)
        if keep:
            self._next()

    def _fail(self, status: int, message: str) -> None:
        self._write(error(status, message), keep=False)

    def _write(self, resp: Response, keep: bool) -> None:
        t = self._transport
        if t is None:
            return
        reason = REASONS.get(resp.status, "Unknown")
        extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items())
        head = (
            f"HTTP/1.1 {resp.status} {reason}\r\nContent-Type: {resp.content_type}\r\n"
            f"Content-Length: {len(resp.body)}\r\n{extra}"
            f"{'' if keep else 'Connection: close' + chr(13) + chr(10)}\r\n"
        )
        t.write(head.encode("latin-1") + resp.body)
        if not keep:
            self._closing = True
            t.close()
