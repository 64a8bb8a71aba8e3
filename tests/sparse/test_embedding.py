from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coadapt.sparse.client import LocalStore, SparseStore
from coadapt.sparse.embedding import SparseEmbedding, SparseEmbeddingCollection
from coadapt.sparse.server import TableSpec


def _weights(store: SparseStore, name: str, ids: list[int]) -> torch.Tensor:
    return torch.from_numpy(store.pull({name: np.array(ids, np.uint64)})[name].copy())


def test_forward_matches_nn_functional_for_every_input_shape() -> None:
    e = SparseEmbedding("t", 3, optimizer="sgd", hparams={"lr": 0.1, "init_scale": 0.5})
    assert isinstance(e.store, LocalStore)
    ids = torch.tensor([[5, 9, 5], [-1, 7, 9]])
    w = _weights(e.store, "t", [5, 9, 7, 2**64 - 1])
    pos = {5: 0, 9: 1, 7: 2, -1: 3}
    ref_idx = torch.tensor([[pos[int(v)] for v in row] for row in ids])
    with torch.no_grad():
        assert torch.allclose(e(ids), F.embedding_bag(ref_idx, w, mode="sum"))
        assert torch.allclose(e(ids[:, 0]), F.embedding(ref_idx[:, 0], w))
        offsets = torch.tensor([0, 1])
        assert torch.allclose(
            e(ids.reshape(-1), offsets),
            F.embedding_bag(ref_idx.reshape(-1), w, offsets, mode="sum"),
        )
    m = SparseEmbedding("t", 3, store=e.store, mode="mean")
    with torch.no_grad():
        assert torch.allclose(m(ids), F.embedding_bag(ref_idx, w, mode="mean"))


def test_uint64_and_int64_ids_are_the_same_features() -> None:
    e = SparseEmbedding("t", 2, hparams={"init_scale": 0.5})
    with torch.no_grad():
        a = e(torch.tensor([2**64 - 1, 3], dtype=torch.uint64))
        b = e(torch.tensor([-1, 3], dtype=torch.int64))
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="int64 or uint64"):
        e(torch.tensor([1.0]))


def test_backward_pushes_summed_gradients_to_the_store() -> None:
    e = SparseEmbedding("t", 2, optimizer="sgd", hparams={"lr": 0.5, "init_scale": 0.0})
    ids = torch.tensor([[1, 1], [2, 1]])  # id 1 appears three times
    out = e(ids)  # (2, 2) bag sums
    (out * torch.tensor([[1.0, 2.0], [10.0, 20.0]])).sum().backward()
    assert e.store.step == 1
    # d/dw_1 = 2*[1,2] + [10,20] = [12, 24];  d/dw_2 = [10, 20];  w = -lr * g
    np.testing.assert_allclose(_weights(e.store, "t", [1, 2]).numpy(), [[-6, -12], [-5, -10]])


def test_not_admitted_ids_embed_as_zero_and_are_not_updated() -> None:
    e = SparseEmbedding(
        "t", 2, optimizer="sgd", hparams={"lr": 1.0, "init_scale": 0.5}, admit_after=3
    )
    y = e(torch.tensor([42]))
    assert not y.any()
    y.sum().backward()
    assert isinstance(e.store, LocalStore)
    assert len(e.store.state.tables[0]) == 0


def test_collection_pulls_all_fields_and_bags() -> None:
    names = ["a", "b"]
    col = SparseEmbeddingCollection(
        names, 2, optimizer="sgd", hparams={"lr": 1.0, "init_scale": 0.5}
    )
    ids = torch.tensor([[[1, 2], [1, 1]], [[3, 3], [2, 2]]])  # (B=2, F=2, L=2)
    out = col(ids)
    assert out.shape == (2, 2, 2)
    wa = _weights(col.store, "a", [1, 2, 3])
    wb = _weights(col.store, "b", [1, 2])
    assert torch.allclose(out[0, 0], wa[0] + wa[1]) and torch.allclose(out[1, 1], 2 * wb[1])
    assert col(ids[:, :, 0]).shape == (2, 2, 2)
    with pytest.raises(ValueError, match=r"\(B, 2\)"):
        col(torch.tensor([1, 2]))


def test_store_dim_mismatch_is_a_clear_error() -> None:
    store = LocalStore([TableSpec("t", 4)])
    with pytest.raises(ValueError, match="dim 4 on the store, module asks 8"):
        SparseEmbedding("t", 8, store=store)


def test_compiled_row_sum_equals_index_add_bit_for_bit() -> None:
    from coadapt.sparse.embedding import _sum_rows

    if _sum_rows is None:
        pytest.skip("numba missing or COADAPT_NO_JIT")
    rng = np.random.default_rng(7)
    index = rng.integers(0, 50, 3000).astype(np.int64)  # heavy repeats: order matters
    grad = rng.standard_normal((3000, 16)).astype(np.float32)
    out = np.full((60, 16), np.nan, np.float32)  # the kernel must zero rows no index hits
    _sum_rows(index, grad, 1, 1, out)
    ref = torch.zeros(60, 16).index_add_(0, torch.from_numpy(index), torch.from_numpy(grad))
    assert np.array_equal(out, ref.numpy())


def test_row_sum_reads_a_sliced_gradient_in_place() -> None:
    """DLRM's backward hands over a (B, F, dim) slice of a (B, F + 1, dim) gradient: it is
    read where it lies (no copy), and the sums equal ``index_add_`` over the copied slice."""
    from coadapt.sparse.embedding import _grad_rows, _sum_rows

    rng = np.random.default_rng(3)
    full = torch.from_numpy(rng.standard_normal((40, 6, 8)).astype(np.float32))
    grad = full[:, 1:]  # (40, 5, 8), not contiguous
    got = _grad_rows(grad)
    assert got is not None
    rows, per = got
    assert per == 6 and rows.data_ptr() == grad.data_ptr()  # a view, not a copy
    assert _grad_rows(full.transpose(1, 2)) is None  # columns not contiguous: caller copies
    if _sum_rows is None:
        pytest.skip("numba missing or COADAPT_NO_JIT")
    index = torch.from_numpy(rng.integers(0, 30, (40, 5)).astype(np.int64))
    out = np.empty((30, 8), np.float32)
    _sum_rows(index.reshape(-1).numpy(), rows.numpy(), per, 5, out)
    ref = torch.zeros(30, 8).index_add_(0, index.reshape(-1), grad.reshape(-1, 8))
    assert np.array_equal(out, ref.numpy())
