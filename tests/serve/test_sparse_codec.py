"""Request arrays of a sparse model: uint64 feature IDs travel exactly in both encodings."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coadapt.serve import codec

NAMES = ["dense", "cats"]
IDS = [True, False]


def test_binary_carries_uint64_ids_exactly() -> None:
    ids = np.array([[0, 2**64 - 1, 2**63]], np.uint64)
    dense = np.ones((1, 3), np.float32)
    body = codec.encode_arrays([dense, ids])
    got = codec.decode_inputs(codec.BINARY, body, NAMES)
    assert got[1].dtype == np.dtype("<u8") and np.array_equal(got[1], ids)
    assert np.array_equal(got[0], dense)


def test_json_ids_are_parsed_exactly_by_name_or_position() -> None:
    ids = [[2**64 - 1, 3], [5, 2**63]]  # numpy alone would make these float64
    by_name = json.dumps({"inputs": {"dense": [[1.0], [2.0]], "cats": ids}}).encode()
    by_pos = json.dumps({"inputs": [[[1.0], [2.0]], ids]}).encode()
    for body in (by_name, by_pos):
        dense, cats = codec.decode_inputs(codec.JSON, body, NAMES, [False, True])
        assert cats.dtype == np.uint64 and cats.tolist() == ids
        assert dense.tolist() == [[1.0], [2.0]]
    neg = json.dumps({"instances": [[-1, 5]]}).encode()
    (arr,) = codec.decode_inputs(codec.JSON, neg, ["ids"], [True])
    assert arr.dtype == np.int64 and arr.view(np.uint64)[0, 0] == 2**64 - 1


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": {"dense": [[1.0]]}}, "missing ['cats']"),
        ({"inputs": {"dense": [[1.0]], "cats": [[1]], "x": [[1]]}}, "unknown ['x']"),
        ({"inputs": [[[1.0]]]}, "a list of 2 arrays"),
        ({"inputs": {"dense": [[1.0]], "cats": [[1.5]]}}, "must be a JSON integer"),
        ({"inputs": {"dense": [[1.0]], "cats": [[1], [2, 3]]}}, "rectangular"),
        ({"inputs": {"dense": [[1.0]], "cats": [[-1, 2**64 - 1]]}}, "must lie in"),
        ({"rows": []}, '{"inputs"'),
        ({"instances": [[1, 2]]}, "takes 2 arrays"),
    ],
)
def test_bad_json_inputs_say_what_is_wrong(body: dict[str, object], words: str) -> None:
    with pytest.raises(codec.CodecError, match=None) as err:
        codec.decode_inputs(codec.JSON, json.dumps(body).encode(), NAMES, [False, True])
    assert words in str(err.value) and err.value.status == 400


def test_binary_array_count_and_content_type_are_checked() -> None:
    one = codec.encode_arrays([np.zeros((1, 2), np.uint64)])
    with pytest.raises(codec.CodecError, match=r"takes 2 array\(s\)"):
        codec.decode_inputs(codec.BINARY, one, NAMES)
    with pytest.raises(codec.CodecError) as err:
        codec.decode_inputs("text/plain", one, NAMES)
    assert err.value.status == 415
