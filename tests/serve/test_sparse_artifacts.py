"""Sparse versions: full and incremental round trips predict exactly what the trainer's model
predicts; a delta on the wrong base and a corrupt shard are refused; expired rows are deleted by
the delta; shard servers export their files in parallel."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if TYPE_CHECKING:
    from torch import Tensor

from coadapt.serve import artifacts  # noqa: E402
from coadapt.serve.models import CtrRanker  # noqa: E402
from coadapt.serve.sparse_artifacts import (  # noqa: E402
    build_sparse_model,
    dense_state,
    load_tables,
    publish_sparse,
    read_delta,
)
from coadapt.serve.sparse_model import SparseView, prepare_delta, serving_module  # noqa: E402
from coadapt.sparse.client import LocalStore, PSClient  # noqa: E402
from coadapt.sparse.server import TableSpec, running_servers  # noqa: E402

FACTORY = "coadapt.serve.models:CtrRanker"
KW = {"features": 12, "groups": 3, "dim": 4, "hidden": 8}
INPUTS = [("ids", "uint64", (12,))]


class Trainer:
    """A CtrRanker trained on random IDs over a store, seeded."""

    def __init__(self, store: LocalStore | PSClient, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.store = store
        self.model = CtrRanker(**KW, store=store)  # type: ignore[arg-type]
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.rng = np.random.default_rng(seed)

    def ids(self, n: int, high: int = 400) -> Tensor:
        return torch.from_numpy(self.rng.integers(0, high, (n, KW["features"])).astype(np.int64))

    def train(self, steps: int, high: int = 400) -> None:
        for _ in range(steps):
            x = self.ids(16, high)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                self.model(x), torch.rand(16)
            )
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def predict(self, x: Tensor) -> np.ndarray:
        with torch.no_grad():
            return self.model(x).numpy()

    def publish(self, root: Path, **kw: object) -> artifacts.Manifest:
        return publish_sparse(
            self.model, self.store, root, factory=FACTORY, factory_kwargs=KW, inputs=INPUTS,
            **kw,  # type: ignore[arg-type]
        )  # fmt: skip


def _served(root: Path, version: str, x: Tensor) -> np.ndarray:
    built = build_sparse_model(root, version)
    with torch.no_grad():
        return built.module(x).numpy()


def _local(ttl: float | None = None) -> LocalStore:
    return LocalStore([TableSpec("ctr", 4, "rowwise_adagrad", {"lr": 0.1}, ttl=ttl)])


def test_full_and_incremental_versions_predict_exactly_what_the_trainer_does(
    tmp_path: Path,
) -> None:
    tr = Trainer(_local())
    tr.train(4)
    probe = tr.ids(10)
    ref1 = tr.predict(probe)  # (creates the probe's rows in training too: they are exported)
    v1 = tr.publish(tmp_path, lineage=artifacts.Lineage("job-1", 4, 64))
    assert v1.kind == "full" and v1.lineage.step == 4
    assert np.array_equal(_served(tmp_path, v1.version, probe), ref1)
    tr.train(3)
    ref2 = tr.predict(probe)
    v2 = tr.publish(tmp_path, incremental=True)
    assert v2.kind == "delta" and v2.parent == v1.version
    assert v2.sparse is not None and v2.sparse["base_export"] == v1.sparse["export_id"]  # type: ignore[index]
    assert not np.array_equal(ref1, ref2)
    assert np.array_equal(_served(tmp_path, v2.version, probe), ref2)
    # the delta holds only what changed: rows of 3 steps of 16 x 12 IDs, not all 400 rows
    delta = read_delta(tmp_path, v2.version)
    assert 0 < delta.parts["ctr"][0].keys.size < v2.sparse["rows"]["ctr"]
    # applied live on the v1 state (overlay, then merged) it gives the same predictions; the
    # tables loaded as a server loads them: packed, in huge pages (the merge grows no base)
    tables = load_tables(tmp_path, v1.version, packed=True)
    base = tables.shards["ctr"][0]
    assert base.huge_pages == "whole"
    assert base._seg_buckets == base.packed_stride(base._nb)
    pending = prepare_delta(SparseView.of(tables), delta.parts, v2.version)
    module = serving_module(v2, dense_state(tmp_path, v2.version), pending.view)
    with torch.no_grad():
        assert np.array_equal(module(probe).numpy(), ref2)  # through the overlay
        for step in pending.steps():
            step()
        assert pending.finish() == []
        assert np.array_equal(module(probe).numpy(), ref2)  # merged
    # unknown IDs get the zero embedding, as not-admitted ones do in training
    unknown = torch.full((1, KW["features"]), 10**12, dtype=torch.int64)
    zero = tr.model.mlp(torch.zeros(1, KW["groups"] * KW["dim"])).squeeze(1).detach().numpy()
    assert np.array_equal(_served(tmp_path, v2.version, unknown), zero)


def test_a_delta_on_the_wrong_base_is_refused(tmp_path: Path) -> None:
    tr = Trainer(_local())
    tr.train(2)
    v1 = tr.publish(tmp_path)
    tr.train(2)
    v2 = tr.publish(tmp_path)  # full
    tr.train(2)
    v3 = tr.publish(tmp_path, incremental=True)  # delta on v2
    assert v3.parent == v2.version
    on_v1 = SparseView.of(load_tables(tmp_path, v1.version))
    from coadapt.serve.artifacts import IntegrityError
    from coadapt.serve.sparse_artifacts import apply_delta_offline

    with pytest.raises(IntegrityError, match="wrong base"):
        apply_delta_offline(load_tables(tmp_path, v1.version), read_delta(tmp_path, v3.version))
    with pytest.raises(IntegrityError, match="does not fit the live state"):
        prepare_delta(on_v1, read_delta(tmp_path, v3.version).parts, v3.version)


def test_a_corrupt_shard_is_rejected_by_its_checksum(tmp_path: Path) -> None:
    tr = Trainer(_local())
    tr.train(2)
    v1 = tr.publish(tmp_path)
    shard = tmp_path / v1.version / v1.sparse["shards"][0]["file"]  # type: ignore[index]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # a flipped bit in the rows: still parses
    shard.write_bytes(bytes(raw))
    from coadapt.serve.artifacts import IntegrityError

    with pytest.raises(IntegrityError, match="sha256"):
        load_tables(tmp_path, v1.version)
    with pytest.raises(IntegrityError, match="sha256"):
        artifacts.load_state(tmp_path, v1.version)  # the generic integrity check too


def test_expired_rows_disappear_in_the_delta(tmp_path: Path) -> None:
    store = _local(ttl=4)
    tr = Trainer(store)
    old = torch.from_numpy(np.arange(1000, 1000 + 2 * KW["features"]).reshape(2, -1))
    tr.predict(old)  # rows created at step 0, never touched again
    store.step = 0
    tr.train(1)
    v1 = tr.publish(tmp_path, expire_now=0)
    ids = old.numpy().reshape(-1).astype(np.uint64)
    t1 = load_tables(tmp_path, v1.version).shards["ctr"][0]
    assert (t1.lookup(ids) >= 0).all()
    tr.train(10)  # the store's clock (its step) moves on; the old rows are not touched
    v2 = tr.publish(tmp_path, incremental=True, expire_now=store.step)
    delta = read_delta(tmp_path, v2.version).parts["ctr"][0]
    assert set(ids.tolist()) <= set(delta.deleted.tolist())
    tables = load_tables(tmp_path, v1.version)
    from coadapt.serve.sparse_artifacts import apply_delta_offline

    apply_delta_offline(tables, read_delta(tmp_path, v2.version))
    assert (tables.shards["ctr"][0].lookup(ids) < 0).all()
    assert tables.rows()["ctr"] == v2.sparse["rows"]["ctr"]  # type: ignore[index]


def test_shard_servers_export_their_files_and_a_restart_forces_a_full_version(
    tmp_path: Path,
) -> None:
    specs = [TableSpec("ctr", 4, "rowwise_adagrad", {"lr": 0.1})]
    root = tmp_path / "model"
    with running_servers(specs, 2, tmp_path / "ps") as procs:
        client = PSClient([p.address for p in procs], async_push=True)
        try:
            tr = Trainer(client)
            tr.train(3)
            probe = tr.ids(8)
            ref1 = tr.predict(probe)
            v1 = tr.publish(root)
            assert [s["file"] for s in v1.sparse["shards"]] == [  # type: ignore[index]
                "shard-000-of-002.rows",
                "shard-001-of-002.rows",
            ]
            assert np.array_equal(_served(root, v1.version, probe), ref1)
            tr.train(2)
            ref2 = tr.predict(probe)
            v2 = tr.publish(root, incremental=True)
            assert v2.kind == "delta"
            assert np.array_equal(_served(root, v2.version, probe), ref2)
        finally:
            client.close()
    # new shard processes (no change log): an incremental publish falls back to a full one
    with running_servers(specs, 2, tmp_path / "ps2") as procs:
        client = PSClient([p.address for p in procs])
        try:
            tr = Trainer(client, seed=1)
            tr.train(1)
            v3 = tr.publish(root, incremental=True)
            assert v3.kind == "full" and v3.parent is None
        finally:
            client.close()


def test_rows_added_by_deltas_never_grow_a_live_table_between_batches() -> None:
    from coadapt.serve.sparse_model import ShardedTable
    from coadapt.sparse.export import DeltaTable
    from coadapt.sparse.table import EmbeddingTable

    base = EmbeddingTable(2, 2, max_rows=1 << 16)
    base.assign(np.arange(1, 101, dtype=np.uint64), np.ones((100, 2), np.float32))
    view = SparseView({"t": ShardedTable("t", 2, [base])})
    for rnd, n_new in enumerate((10, 5000, 20_000)):  # the last two outgrow the extras' room
        start = 1000 + 100_000 * rnd
        new = np.arange(start, start + n_new, dtype=np.uint64)
        keys = np.concatenate([np.array([5], np.uint64), new])
        rows = np.full((keys.size, 2), rnd + 2, np.float32)
        t = view.tables["t"]
        gone = np.array([7], np.uint64)
        after = t.rows(0) + n_new - t.present(0, gone)
        part = DeltaTable("t", 2, after, keys, rows, gone)
        old_extras = t.extras[0]
        old_len = 0 if old_extras is None else len(old_extras)
        pending = prepare_delta(view, {"t": [part]}, f"v{rnd}")
        new_t = pending.view.tables["t"]
        grown = new_t.extras[0]
        assert grown is not None and new_t.room[0] >= len(grown) + n_new  # room made up front
        levels = grown._level.copy()
        for step in pending.steps():
            step()
        assert pending.finish() == []
        assert np.array_equal(grown._level, levels)  # the merge grew no segment
        if old_extras is not None and old_extras is not grown:
            assert len(old_extras) == old_len  # the old view's extras untouched
        got = new_t.gather(np.array([5, 7, start, start + n_new - 1, 10**9], np.uint64))
        assert got[:, 0].tolist() == [rnd + 2, 0, rnd + 2, rnd + 2, 0]
        view = pending.view
