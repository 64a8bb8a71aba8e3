from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from coadapt.sparse.client import LocalStore, PSClient, dedupe
from coadapt.sparse.compress import CompressionConfig
from coadapt.sparse.embedding import SparseEmbeddingCollection
from coadapt.sparse.server import ServerProcess, TableSpec, running_servers

DIM, NF, VOCAB = 4, 3, 40
HP = {"lr": 0.1, "init_scale": 0.1}
REF = [TableSpec(f"ref{f}", DIM, "adagrad", HP) for f in range(NF)]
REF_SYNC = [TableSpec(f"refsync{f}", DIM, "adagrad", HP) for f in range(NF)]
SSP = [TableSpec(f"ssp{f}", DIM, "adagrad", {"lr": 0.1, "init_scale": 0.1}) for f in range(NF)]
CMP = [TableSpec(f"cmp{f}", DIM, "adagrad", {"lr": 0.1, "init_scale": 0.1}) for f in range(NF)]
REF_PRE = [TableSpec(f"refpre{f}", DIM, "adagrad", HP) for f in range(NF)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with running_servers(
        REF + REF_SYNC + REF_PRE + SSP + CMP, 2, tmp_path_factory.mktemp("ps")
    ) as procs:
        yield procs


def _vocab(seed: int) -> np.ndarray:
    """Per field, VOCAB random 64-bit IDs (the full uint64 range, 0 and 2**64-1 included)."""
    v = np.random.default_rng(seed).integers(0, 2**64 - 1, (NF, VOCAB), dtype=np.uint64)
    v[0, 0], v[1, 0] = 0, 2**64 - 1
    return v


def _batch(rng: np.random.Generator, vocab: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Index batch (b, NF) into the vocab and the matching feature IDs; duplicates on purpose."""
    idx = rng.integers(0, VOCAB // 2, (b, NF))
    return idx, np.stack([vocab[f][idx[:, f]] for f in range(NF)], axis=1)


_PLANTED = np.random.default_rng(7).normal(size=(NF, VOCAB))


def _labels(idx: np.ndarray) -> torch.Tensor:
    """Learnable labels: the sign of a planted per-ID weight sum."""
    score = sum(_PLANTED[f][idx[:, f]] for f in range(NF))
    return torch.from_numpy((score > 0).astype(np.float32))


def test_dedupe() -> None:
    u, inv = dedupe(np.array([[7, 3], [7, -1]], np.int64))
    assert u.tolist() == [3, 7, 2**64 - 1]
    assert u[inv].tolist() == [7, 3, 7, 2**64 - 1]


@pytest.mark.parametrize(("async_push", "prefetch"), [(True, False), (False, False), (True, True)])
def test_s0_with_two_shards_equals_dense_pytorch_reference(
    servers: list[ServerProcess], async_push: bool, prefetch: bool
) -> None:
    vocab = _vocab(1)
    # fresh tables per case: the reference starts from the servers' initial rows
    specs = REF_PRE if prefetch else REF if async_push else REF_SYNC
    with PSClient([p.address for p in servers], staleness=0, async_push=async_push) as client:
        emb = SparseEmbeddingCollection([s.name for s in specs], DIM, store=client)
        # The reference starts from the servers' initial rows (pull creates them).
        init = client.pull({s.name: vocab[f] for f, s in enumerate(specs)})
        ref_emb = nn.ModuleList(
            nn.Embedding.from_pretrained(torch.from_numpy(init[s.name].copy()), freeze=False)
            for s in specs
        )
        torch.manual_seed(0)
        head = nn.Linear(NF * DIM, 1)
        ref_head = nn.Linear(NF * DIM, 1)
        ref_head.load_state_dict(head.state_dict())
        opt = torch.optim.SGD(head.parameters(), lr=0.05)
        ref_opt = torch.optim.SGD(ref_head.parameters(), lr=0.05)
        ref_sparse = torch.optim.Adagrad(ref_emb.parameters(), lr=0.1, eps=1e-10)
        rng = np.random.default_rng(2)
        loss_fn = nn.BCEWithLogitsLoss()
        batches = [_batch(rng, vocab, 32) for _ in range(7)]
        for i in range(6):
            idx, ids = batches[i]
            y = _labels(idx)
            opt.zero_grad()
            logits = head(emb(torch.from_numpy(ids.view(np.int64))).flatten(1)).squeeze(1)
            if prefetch:  # batch i + 1's rows are pulled right after batch i's push
                emb.prefetch(torch.from_numpy(batches[i + 1][1].view(np.int64)))
            loss = loss_fn(logits, y)
            loss.backward()
            opt.step()
            ref_opt.zero_grad()
            ref_sparse.zero_grad()
            ref_in = torch.stack([ref_emb[f](torch.from_numpy(idx[:, f])) for f in range(NF)], 1)
            ref_loss = loss_fn(ref_head(ref_in.flatten(1)).squeeze(1), y)
            ref_loss.backward()
            ref_opt.step()
            ref_sparse.step()
            assert abs(loss.item() - ref_loss.item()) <= 1e-6
        assert client.step == 6
        assert client.prefetch_hits == (5 if prefetch else 0)  # every later batch used one
        final = client.pull({s.name: vocab[f] for f, s in enumerate(specs)})
        for f, s in enumerate(specs):
            got = final[s.name]
            want = ref_emb[f].get_parameter("weight").detach().numpy()
            assert np.abs(got - want).max() <= 1e-6
            assert np.abs(got - init[s.name]).max() > 1e-3  # the rows really moved
        for a, b in zip(head.parameters(), ref_head.parameters(), strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_prefetch_is_discarded_when_a_push_or_other_ids_come_first(
    servers: list[ServerProcess],
) -> None:
    """A prefetched pull answers only the next pull of the same IDs at the same step: a push
    sent after it (which the prefetched rows do not contain) or other IDs make a fresh pull."""
    names = [s.name for s in CMP]
    ids = {n: np.arange(5, dtype=np.uint64) + 100 for n in names}
    with PSClient([p.address for p in servers], staleness=0) as client:
        before = client.pull_joined(ids).copy()
        client.prefetch(ids)
        client.push({n: (k, np.ones((k.size, DIM), np.float32)) for n, k in ids.items()})
        after = client.pull_joined(ids)
        assert client.prefetch_hits == 0
        assert np.abs(after - before).min() > 1e-3  # the pushed update is visible
        client.prefetch(ids)
        other = {n: k + np.uint64(1) for n, k in ids.items()}
        client.pull_joined(other)
        assert client.prefetch_hits == 0
        client.prefetch(ids)
        assert np.array_equal(client.pull_joined(ids), after)
        assert client.prefetch_hits == 1


def test_ssp_s4_trains_and_never_exceeds_its_staleness(servers: list[ServerProcess]) -> None:
    vocab = _vocab(3)
    with PSClient([p.address for p in servers], staleness=4) as client:
        emb = SparseEmbeddingCollection([s.name for s in SSP], DIM, store=client)
        torch.manual_seed(0)
        head = nn.Linear(NF * DIM, 1)
        opt = torch.optim.SGD(head.parameters(), lr=0.1)
        rng = np.random.default_rng(4)
        losses = []
        eval_idx, eval_ids = _batch(np.random.default_rng(99), vocab, 256)
        loss_fn = nn.BCEWithLogitsLoss()

        def eval_loss() -> float:
            with torch.no_grad():
                out = head(emb(torch.from_numpy(eval_ids.view(np.int64))).flatten(1)).squeeze(1)
                return float(loss_fn(out, _labels(eval_idx)))

        before = eval_loss()
        for _ in range(60):
            idx, ids = _batch(rng, vocab, 64)
            opt.zero_grad()
            out = head(emb(torch.from_numpy(ids.view(np.int64))).flatten(1)).squeeze(1)
            loss = loss_fn(out, _labels(idx))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert 1 <= client.max_staleness <= 4
        assert client.cache_hits > 0 and client.cache_misses > 0
        assert eval_loss() < before - 0.05


def test_compressed_push_sends_fewer_bytes_and_still_trains(servers: list[ServerProcess]) -> None:
    vocab = _vocab(5)
    cfg = CompressionConfig(values="int8")
    names = [s.name for s in CMP]
    with PSClient([p.address for p in servers], compression=cfg) as client:
        before = client.pull({n: vocab[f] for f, n in enumerate(names)})
        g = {n: (vocab[f], np.full((VOCAB, DIM), 0.3, np.float32)) for f, n in enumerate(names)}
        client.push(g)
        after = client.pull({n: vocab[f] for f, n in enumerate(names)})
        for n in names:  # AdaGrad's first step moves every weight by lr regardless of scale
            np.testing.assert_allclose(after[n], before[n] - 0.1, atol=1e-5)
        # int8: 8-byte id + 4-byte scale + 1 byte per value vs 8 + 4 per value, plus headers
        assert client.bytes_pushed < 0.75 * client.bytes_pushed_raw


def test_local_store_matches_its_shard_state() -> None:
    store = LocalStore([TableSpec("t", 2, "sgd", {"lr": 1.0, "init_scale": 0.0})])
    ids = np.array([4, 8], np.uint64)
    assert not store.pull({"t": ids})["t"].any()
    store.push({"t": (ids, np.array([[1, 2], [3, 4]], np.float32))})
    np.testing.assert_array_equal(store.pull({"t": ids})["t"], [[-1, -2], [-3, -4]])
    assert store.step == 1
    with pytest.raises(KeyError, match="no sparse table 'x'"):
        store.pull({"x": ids})


def test_local_store_threads_give_identical_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables split over two threads (table t on thread t % 2): same rows, same counters and
    the push still reuses its pull's indices (each thread keeps its own memo)."""
    import coadapt.sparse.client as client_mod

    monkeypatch.setattr(client_mod, "_SPLIT_MIN_IDS", 0)  # split even these small calls
    # small tables: comparing the default tables' whole row arenas took 22 s
    specs = [TableSpec(f"t{i}", 8, "rowwise_adagrad", {"lr": 0.1}, max_rows=4096) for i in range(5)]
    one, two = LocalStore(specs, threads=1), LocalStore(specs, threads=2)
    rng = np.random.default_rng(5)
    for _ in range(4):
        ids = {s.name: np.unique(rng.integers(0, 300, 200).astype(np.uint64)) for s in specs}
        rows = [st.pull_joined(ids) for st in (one, two)]
        np.testing.assert_array_equal(rows[0], rows[1])
        grads = {
            n: (k, rng.standard_normal((k.size, 8)).astype(np.float32)) for n, k in ids.items()
        }
        for st in (one, two):
            st.push(grads)
    assert one.state.pulled_rows == two.state.pulled_rows
    assert one.state.pushed_rows == two.state.pushed_rows
    for a, b in zip(one.state.tables, two.state.tables, strict=True):
        np.testing.assert_array_equal(a.row_arena(), b.row_arena())
    both = one.pull({s.name: np.arange(300, dtype=np.uint64) for s in specs})
    np.testing.assert_array_equal(
        both["t3"], two.pull({s.name: np.arange(300, dtype=np.uint64) for s in specs})["t3"]
    )
    with pytest.raises(ValueError, match="threads must be >= 1"):
        LocalStore(specs, threads=0)


def test_client_unknown_table_is_a_clear_error(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    with PSClient([p.address for p in servers]) as client, pytest.raises(KeyError, match="nope"):
        client.pull({"nope": np.array([1], np.uint64)})


def test_shard_payload_pushes_deliver_all_mass_by_the_checkpoint(tmp_path: Path) -> None:
    """Top-k over all tables of a shard with error feedback: after save() (which flushes the
    residuals) plain SGD rows equal -lr x the sum of every gradient pushed, to float32 rounding;
    bytes_pushed counts every header on the wire."""
    sgd = {"lr": 1.0, "init_scale": 0.0}
    specs = [TableSpec("lin", 1, "sgd", sgd), TableSpec("emb", DIM, "sgd", sgd)]
    cfg = CompressionConfig(values="ternary", sparsify="topk", density=0.05)
    rng = np.random.default_rng(11)
    ids = {n: np.unique(rng.integers(0, 2**64 - 1, 30, dtype=np.uint64)) for n in ("lin", "emb")}
    total = {n: np.zeros((30, s.dim)) for n, s in zip(ids, specs, strict=True)}
    with (
        running_servers(specs, 2, tmp_path, ckpt_dir=tmp_path / "ckpt") as procs,
        PSClient([p.address for p in procs], compression=cfg) as client,
    ):
        client.pull(ids)
        for _ in range(15):
            grads = {}
            for n, s in zip(ids, specs, strict=True):
                pick = np.sort(rng.choice(30, 12, replace=False))
                g = rng.standard_normal((12, s.dim)).astype(np.float32)
                total[n][pick] += g
                grads[n] = (ids[n][pick], g)
            client.push(grads)
        client.wait()
        mid = client.bytes_pushed
        assert 0 < mid < 0.25 * client.bytes_pushed_raw
        client.save({"why": "flush"})
        assert client.bytes_pushed > mid  # the flush went out and was counted
        final = client.pull(ids)
    for n in ids:
        np.testing.assert_allclose(final[n], -total[n], atol=1e-4)


def test_progress_metrics_report_rows_per_shard_and_push_bytes(
    servers: list[ServerProcess],
) -> None:
    # fresh ids (not _vocab: every vocab holds 0 and 2**64-1, which other tests created)
    vocab = np.random.default_rng(21).integers(1, 2**63, (NF, VOCAB), dtype=np.uint64)
    names = [s.name for s in SSP]
    with PSClient([p.address for p in servers], async_push=False) as client:
        before = client.progress_metrics()
        client.pull({n: vocab[f] for f, n in enumerate(names)})
        client.push(
            {n: (vocab[f], np.zeros((VOCAB, DIM), np.float32)) for f, n in enumerate(names)}
        )
        after = client.progress_metrics()
    shards = [after[f"sparse/rows/shard{i}"] for i in range(len(servers))]
    assert sum(shards) == after["sparse/rows"]
    assert all(s > 0 for s in shards)  # both shards hold some of the new rows
    assert after["sparse/rows"] - before["sparse/rows"] == NF * VOCAB  # new ids, all tables
    # 16-byte request header + 3 part entries + ids + float32 rows, per shard
    assert after["sparse/pushed_bytes"] == 2 * 16 + 6 * 2 * NF + NF * VOCAB * (8 + 4 * DIM)
    local = LocalStore([TableSpec("t", 2, "sgd", {"lr": 1.0})])
    local.pull({"t": np.arange(5, dtype=np.uint64)})
    assert local.progress_metrics() == {
        "sparse/rows": 5.0,
        "sparse/rows/shard0": 5.0,
        "sparse/pushed_bytes": 0.0,
    }
