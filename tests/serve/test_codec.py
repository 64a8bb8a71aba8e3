"""The binary batch format and the JSON body: round trips and every malformed case."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from coadapt.serve import codec


def test_binary_round_trip_keeps_dtype_shape_and_bytes() -> None:
    rng = np.random.default_rng(0)
    arrays = [
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.integers(-(2**40), 2**40, size=(2, 7, 1), dtype=np.int64),
        np.zeros((0, 4), dtype=np.float32),
    ]
    body = codec.encode_arrays(arrays)
    assert body[:4] == codec.MAGIC
    back = codec.decode_arrays(body)
    assert len(back) == 3
    for a, b in zip(arrays, back, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_binary_layout_is_little_endian_and_aligned() -> None:
    body = codec.encode_arrays([np.array([[1.0, 2.0]], dtype=np.float32)])
    assert struct.unpack_from("<4sHH", body) == (b"CXB1", 1, 1)
    assert struct.unpack_from("<BBH2I", body, 8) == (1, 2, 0, 1, 2)
    assert len(body) == 24 + 8  # header 8 + array head 4 + dims 8 = 20, data aligned to 24
    assert np.frombuffer(body, "<f4", offset=24).tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"CXB", "shorter than its 8-byte header"),
        (b"XXXX\x01\x00\x01\x00", "not a batch"),
        (b"CXB1\x02\x00\x01\x00", "format version 2"),
        (b"CXB1\x01\x00\x01\x00", "ends inside the header of array 0"),
        (b"CXB1\x01\x00\x01\x00\x09\x01\x00\x00\x01\x00\x00\x00", "unknown dtype code 9"),
        (b"CXB1\x01\x00\x01\x00\x01\x01\x00\x00\x04\x00\x00\x00" + b"\0" * 4, "needs 16 bytes"),
        (codec.encode_arrays([np.zeros((1, 1), np.float32)]) + b"xx", "2 stray bytes"),
    ],
)
def test_malformed_binary_says_what_is_wrong(body: bytes, match: str) -> None:
    with pytest.raises(codec.CodecError, match=match) as info:
        codec.decode_arrays(body)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be an object"),
        (b'{"instances": []}', "non-empty list"),
        (b'{"instances": [[1, 2], [3]]}', "rectangular"),
        (b'{"instances": [["a", "b"]]}', "only numbers"),
        (b'{"instances": [[1, null]]}', "only numbers"),
    ],
)
def test_malformed_json_says_what_is_wrong(body: bytes, match: str) -> None:
    with pytest.raises(codec.CodecError, match=match):
        codec.decode(codec.JSON, body)


def test_unknown_content_type_is_415() -> None:
    with pytest.raises(codec.CodecError, match="unsupported Content-Type 'text/csv'") as info:
        codec.decode("text/csv", b"1,2")
    assert info.value.status == 415


def test_json_round_trip() -> None:
    x = codec.decode("application/json; charset=utf-8", b'{"instances": [[1, 2.5]]}')
    assert x.tolist() == [[1.0, 2.5]]
    out = codec.encode_json(np.array([[0.5]], dtype=np.float32), "m", "00000003")
    assert out == b'{"predictions": [[0.5]], "model": "m", "version": "00000003"}'
