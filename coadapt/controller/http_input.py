"""Hardening of what HTTP requests carry: body size, JSON bodies, tokens and integer bounds.

Every rule here answers bad input with a 4xx JSON error that names the limit, never a 500:
a body over :data:`MAX_BODY_BYTES` is a 413 before it is read into memory, a body that is not
strict JSON (invalid UTF-8, ``NaN``, a syntax error) a 422 with its line and column, and
tokens are compared as bytes so that any character a client sends is just a wrong token.
"""

from __future__ import annotations

import hmac
import json
import math
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coadapt.controller.errors import PayloadTooLargeError, SpecError

#: The largest request body the API reads (a job or experiment spec, a metrics record).
MAX_BODY_BYTES = 1 << 20
#: The largest integer SQLite's INTEGER and PostgreSQL's BIGINT hold (and a file offset).
BIGINT_MAX = 2**63 - 1
#: 32-bit columns (attempts, ranks, batch sizes) hold at most this.
INT32_MAX = 2**31 - 1


def too_large(size: int | None = None, limit: int = MAX_BODY_BYTES) -> PayloadTooLargeError:
    got = f"{size} bytes" if size is not None else f"more than {limit} bytes"
    return PayloadTooLargeError(
        f"request body too large ({got}); the limit is {limit} bytes ({limit >> 10} KiB): "
        "send a smaller spec (keep data and long argument lists in files the job reads)",
        [{"field": "body", "message": f"at most {limit} bytes", "accepted": f"<= {limit} bytes"}],
    )


class _BodyOverflow(Exception):
    pass


class BodySizeLimit:
    """ASGI middleware: refuse a body over ``limit`` bytes with a 413 JSON error.

    A declared ``Content-Length`` over the limit is refused before anything is read; a body
    without one (chunked) is counted as it streams and refused once it passes the limit, so
    the application never holds more than ``limit`` bytes of it.
    """

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                if declared is not None and declared > self.limit:
                    await self._refuse(send, declared)
                    return
        seen = 0
        started = overflowed = False

        async def counting_receive() -> Message:
            nonlocal seen, overflowed
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    overflowed = True
                    raise _BodyOverflow
            return message

        async def tracking_send(message: Message) -> None:
            # Whatever the app answers to a body it could not finish reading (FastAPI turns
            # a failed read into a 400) is replaced by the 413 that says why.
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if overflowed:
                    await self._refuse(send, None)
                    return
            if not overflowed:
                await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyOverflow:
            if not started:
                await self._refuse(send, None)

    async def _refuse(self, send: Send, size: int | None) -> None:
        err = too_large(size, self.limit)
        body = json.dumps(err.to_json()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": err.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (use null or a finite number)")


def _finite(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text} overflows a 64-bit float")
    return x


def parse_json(raw: bytes, what: str = "request body") -> Any:
    """Strict JSON (RFC 8259: UTF-8, no NaN/Infinity, no number beyond a float's range);
    an empty body is ``None``.

    Errors are a 422 naming the line and column, so a client sees where its body broke.
    """
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{what} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "send JSON encoded as UTF-8",
            [{"field": "body", "message": "not UTF-8", "accepted": "a UTF-8 JSON document"}],
        ) from None
    try:
        return json.loads(text, parse_constant=_no_constants, parse_float=_finite)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise SpecError(
            f"{what} is not valid JSON: {exc.msg} at {where}",
            [{"field": "body", "message": f"{exc.msg} at {where}", "accepted": "a JSON document"}],
        ) from None
    except RecursionError:
        raise SpecError(
            f"{what} nests too deeply",
            [{"field": "body", "message": "nests too deeply", "accepted": "a JSON document"}],
        ) from None
    except ValueError as exc:
        raise SpecError(
            f"{what} is not valid JSON: {exc}",
            [{"field": "body", "message": str(exc), "accepted": "a JSON document"}],
        ) from None


async def json_body(request: Request) -> Any:
    """The request's body as strict JSON (:func:`parse_json`); size-capped by the middleware."""
    return parse_json(await request.body())


def tokens_equal(expected: str, given: str) -> bool:
    """Constant-time token comparison that accepts any characters (as UTF-8 bytes).

    ``hmac.compare_digest`` raises ``TypeError`` on non-ASCII ``str``; comparing bytes makes a
    token with any character simply a wrong token.
    """
    return hmac.compare_digest(
        expected.encode("utf-8", "surrogatepass"), given.encode("utf-8", "surrogatepass")
    )


__all__ = [
    "BIGINT_MAX",
    "INT32_MAX",
    "MAX_BODY_BYTES",
    "BodySizeLimit",
    "json_body",
    "parse_json",
    "tokens_equal",
    "too_large",
]
