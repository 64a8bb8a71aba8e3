"""Request and response bodies: JSON for convenience, a compact binary batch for speed.

Binary (``application/x-coadapt-batch``), all little-endian::

    header   magic b"CXB1" | u16 format version (1) | u16 number of arrays
    per array u8 dtype code (1 float32, 2 int64, 3 uint64) | u8 ndim | u16 zero | ndim x u32 dims
    data     each array's raw bytes, in order, each starting at a multiple of 8 bytes
             from the start of the body

JSON: ``{"instances": [[...], ...]}`` in, ``{"predictions": [[...], ...], "model": ...,
"version": ...}`` out (the TF-serving shape). A model that takes several arrays (a sparse model:
dense features and feature IDs) gets them as ``{"inputs": {"name": [[...], ...], ...}}`` (or a
list in the model's order) in JSON, or as several arrays in one binary body; feature IDs are
uint64 (code 3) or int64 (reinterpreted bit for bit). Every malformed body raises
:class:`CodecError` with a message that says what is wrong; the server turns it into a 4xx.
"""

from __future__ import annotations

import contextlib
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
CODES: dict[int, np.dtype[Any]] = {1: np.dtype("<f4"), 2: np.dtype("<i8"), 3: np.dtype("<u8")}
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
            raise CodecError(f"dtype {a.dtype} cannot be encoded: use float32, int64 or uint64")
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
            raise CodecError(f"array {i}: unknown dtype code {code} (1 float32, 2 int64, 3 uint64)")
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


def _json_array(value: Any, what: str) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise CodecError(f"{what} must be a non-empty list of rows")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError) as exc:
        raise CodecError(f"{what} must be a rectangular list of numbers ({exc})") from None
    if arr.dtype.kind not in "fiu":
        raise CodecError(
            f"{what} must hold only numbers (got {arr.dtype.kind!r} values: strings, nulls, "
            "booleans, ragged rows, or integers outside [-2**63, 2**64))"
        )
    return arr


def _json_ids(value: Any, what: str) -> np.ndarray:
    """Feature IDs from JSON integers, exactly: numpy would turn ``[2**64 - 1, 3]`` into
    float64 and lose the low bits. Negative IDs are int64 (reinterpreted as uint64 later)."""
    if not isinstance(value, list) or not value:
        raise CodecError(f"{what} must be a non-empty list of rows")
    obj = np.empty(0, dtype=object)
    with contextlib.suppress(ValueError):
        obj = np.array(value, dtype=object)
    if obj.dtype != object or obj.ndim < 2 or obj.size == 0:
        raise CodecError(f"{what} must be a rectangular list of rows of integer feature IDs")
    kinds = np.frompyfunc(lambda v: type(v) is int, 1, 1)(obj)
    if not kinds.all():
        raise CodecError(f"{what} holds feature IDs: every value must be a JSON integer")
    for dtype in (np.int64, np.uint64):
        try:
            return obj.astype(dtype)
        except OverflowError:
            continue
    raise CodecError(
        f"{what}: feature IDs must lie in [-2**63, 2**64) and not mix negative values with "
        "values >= 2**63 (send them all as uint64)"
    )


def decode_json_inputs(
    body: bytes, names: list[str], ids: list[bool] | None = None
) -> list[np.ndarray]:
    """The arrays of a JSON body for a model taking the arrays ``names`` (in order):
    ``{"inputs": {name: rows, ...}}``, ``{"inputs": [rows, ...]}``, or, for one array,
    ``{"instances": rows}``. ``ids[i]`` marks arrays of feature IDs (parsed exactly)."""
    flags = ids or [False] * len(names)

    def arr(v: Any, i: int, what: str) -> np.ndarray:
        return _json_ids(v, what) if flags[i] else _json_array(v, what)

    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or ("inputs" not in doc and "instances" not in doc):
        raise CodecError(
            f'JSON body must be an object {{"inputs": {{{", ".join(repr(n) for n in names)}: '
            "[[...], ...]}}"
        )
    if "instances" in doc and "inputs" not in doc:
        if len(names) != 1:
            raise CodecError(
                f'the model takes {len(names)} arrays {names}: send {{"inputs": {{name: rows}}}}, '
                'not "instances"'
            )
        return [arr(doc["instances"], 0, '"instances"')]
    inputs = doc["inputs"]
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        extra = sorted(set(inputs) - set(names))
        if missing or extra:
            raise CodecError(
                f'"inputs" must name exactly {names}; missing {missing}, unknown {extra}'
            )
        return [arr(inputs[n], i, f'"inputs"."{n}"') for i, n in enumerate(names)]
    if isinstance(inputs, list) and len(inputs) == len(names):
        return [arr(v, i, f'"inputs"[{i}]') for i, v in enumerate(inputs)]
    raise CodecError(
        f'"inputs" must be an object with keys {names} or a list of {len(names)} arrays'
    )


def decode_inputs(
    content_type: str, body: bytes, names: list[str], ids: list[bool] | None = None
) -> list[np.ndarray]:
    """The request's arrays for a model taking the arrays ``names``, by content type
    (``ids[i]``: array i holds feature IDs)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON:
        return decode_json_inputs(body, names, ids)
    if kind == BINARY:
        arrays = decode_arrays(body)
        if len(arrays) != len(names):
            raise CodecError(
                f"the model takes {len(names)} array(s) {names}, the body holds {len(arrays)}"
            )
        return arrays
    raise CodecError(
        f"unsupported Content-Type {content_type or '(none)'!r}: send {JSON} or {BINARY}",
        status=415,
    )


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
