"""Request and response bodies: JSON for convenience, a compact binary batch for speed.

Binary (``application/x-coadapt-batch``), all little-endian::

    header   magic b"CXB1" | u16 format version (1) | u16 number of arrays
    per array u8 dtype code (1 float32, 2 int64) | u8 ndim | u16 zero | ndim x u32 dims
    data     each array's raw bytes, in order, each starting at a multiple of 8 bytes
             from the start of the body

JSON: ``{"instances": [[...], ...]}`` in, ``{"predictions": [[...], ...], "model": ...,
"version": ...}`` out (the TF-serving shape). Every malformed body raises :class:`CodecError`
with a message that says what is wrong; the server turns it into a 4xx.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

JSON = "application/json"
BINARY = "application/x-coadapt-batch"
MAGIC = b"CXB1"
CODEC_VERSION = 1
_HEAD = struct.Struct("<4sHH")
_ARRAY = struct.Struct("<BBH")
CODES: dict[int, np.dtype[Any]] = {1: np.dtype("<f4"), 2: np.dtype("<i8")}
_CODE_OF = {v: k for k, v in CODES.items()}
MAX_NDIM = 8


class CodecError(ValueError):
    """A body the server cannot use; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _align(n: int) -> int:
    return (n + 7) & ~7


def encode_arrays(arrays: list[np.ndarray]) -> bytes:
    """The binary body holding ``arrays`` (float32 or int64)."""
    head = [_HEAD.pack(MAGIC, CODEC_VERSION, len(arrays))]
    for a in arrays:
        dt = a.dtype.newbyteorder("<")
        if dt not in _CODE_OF:
            raise CodecError(f"dtype {a.dtype} cannot be encoded: use float32 or int64")
        head.append(_ARRAY.pack(_CODE_OF[dt], a.ndim, 0))
        head.append(struct.pack(f"<{a.ndim}I", *a.shape))
    out = bytearray(b"".join(head))
    for a in arrays:
        out += b"\0" * (_align(len(out)) - len(out))
        out += np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    return bytes(out)


def decode_arrays(body: bytes) -> list[np.ndarray]:
    """The arrays of a binary body (read-only views into ``body``)."""
    if len(body) < _HEAD.size:
        raise CodecError(f"binary body of {len(body)} bytes is shorter than its 8-byte header")
    magic, version, count = _HEAD.unpack_from(body, 0)
    if magic != MAGIC:
        raise CodecError(f"binary body starts with {magic!r}, not {MAGIC!r}: not a batch")
    if version != CODEC_VERSION:
        raise CodecError(f"binary format version {version}; this server reads {CODEC_VERSION}")
    pos = _HEAD.size
    specs: list[tuple[np.dtype[Any], tuple[int, ...]]] = []
    for i in range(count):
        if pos + _ARRAY.size > len(body):
            raise CodecError(f"binary body ends inside the header of array {i}")
        code, ndim, _ = _ARRAY.unpack_from(body, pos)
        pos += _ARRAY.size
        if code not in CODES:
            raise CodecError(f"array {i}: unknown dtype code {code} (1 float32, 2 int64)")
        if ndim > MAX_NDIM or pos + 4 * ndim > len(body):
            raise CodecError(f"array {i}: bad number of dimensions {ndim}")
        shape = struct.unpack_from(f"<{ndim}I", body, pos)
        pos += 4 * ndim
        specs.append((CODES[code], tuple(shape)))
    out: list[np.ndarray] = []
    for i, (dt, shape) in enumerate(specs):
        pos = _align(pos)
        n = int(np.prod(shape, dtype=np.int64))
        end = pos + n * dt.itemsize
        if end > len(body):
            raise CodecError(
                f"array {i} {list(shape)} needs {n * dt.itemsize} bytes, body has "
                f"{max(0, len(body) - pos)} left"
            )
        out.append(np.frombuffer(body, dtype=dt, count=n, offset=pos).reshape(shape))
        pos = end
    if pos != len(body):
        raise CodecError(f"{len(body) - pos} stray bytes after the last array")
    return out


def decode_json(body: bytes) -> np.ndarray:
    """The instances of a JSON body as a 2-D or deeper array (float64 or int64)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "instances" not in doc:
        raise CodecError('JSON body must be an object {"instances": [[...], ...]}')
    inst = doc["instances"]
    if not isinstance(inst, list) or not inst:
        raise CodecError('"instances" must be a non-empty list of rows')
    try:
        arr = np.asarray(inst)
    except ValueError as exc:
        raise CodecError(f'"instances" must be a rectangular list of numbers ({exc})') from None
    if arr.dtype.kind not in "fiu":
        raise CodecError(
            f'"instances" must hold only numbers (got {arr.dtype.kind!r} values: '
            "strings, nulls, booleans or ragged rows)"
        )
    return arr


def encode_json(predictions: np.ndarray, model: str, version: str) -> bytes:
    """The JSON answer for ``predictions``."""
    return json.dumps(
        {"predictions": predictions.tolist(), "model": model, "version": version}
    ).encode()


def decode(content_type: str, body: bytes) -> np.ndarray:
    """The request's one input array, by content type (415 for an unknown one)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON:
        return decode_json(body)
    if kind == BINARY:
        arrays = decode_arrays(body)
        if len(arrays) != 1:
            raise CodecError(f"the model takes 1 input array, the body holds {len(arrays)}")
        return arrays[0]
    raise CodecError(
        f"unsupported Content-Type {content_type or '(none)'!r}: send {JSON} or {BINARY}",
        status=415,
    )
