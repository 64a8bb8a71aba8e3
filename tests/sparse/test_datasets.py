"""Planted-model Criteo generator: format, determinism, ceiling, learnability, drift, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from coadapt.sparse.datasets import (
    PlantedConfig,
    format_criteo,
    generate,
    iter_planted,
    main,
)


def parse(path: Path) -> tuple[np.ndarray, list[list[str]]]:
    lines = path.read_text().splitlines()
    fields = [ln.split("\t") for ln in lines]
    return np.array([int(f[0]) for f in fields]), fields


def design(fields: list[list[str]]) -> sp.csr_matrix:
    """One-hot of the categoricals (exact values, no hashing) + log1p dense."""
    vocab: dict[tuple[int, str], int] = {}
    rows, cols = [], []
    dense = np.zeros((len(fields), 13))
    for i, f in enumerate(fields):
        for j in range(13):
            dense[i, j] = np.log1p(int(f[1 + j])) if f[1 + j] else 0.0
        for j in range(26):
            if f[14 + j]:
                rows.append(i)
                cols.append(vocab.setdefault((j, f[14 + j]), len(vocab)))
    onehot = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(fields), len(vocab)))
    return sp.hstack([onehot, sp.csr_matrix(dense)]).tocsr()


def test_rows_have_criteo_layout(tmp_path: Path) -> None:
    res = generate(PlantedConfig(rows=3000, seed=4, chunk_rows=1000), tmp_path / "d.tsv")
    labels, fields = parse(tmp_path / "d.tsv")
    assert res.rows == len(fields) == 3000 and res.positives == labels.sum()
    assert all(len(f) == 40 for f in fields)
    assert set(labels.tolist()) == {0, 1}
    for f in fields[:500]:
        for v in f[1:14]:
            assert v == "" or (v.isdigit() and (v == "0" or v[0] != "0"))
        for v in f[14:]:
            assert v == "" or (len(v) == 8 and int(v, 16) >= 0)
    cats = {f[14] for f in fields}
    assert len(cats) > 100  # Zipf over 10**8 values: a heavy head and a long tail
    assert max(int(v, 16) for v in cats if v) > 2**28  # hashed IDs, not small ranks
    meta = json.loads(Path(res.meta_path).read_text())
    assert meta["result"]["ceiling_auc"] == res.ceiling_auc
    assert meta["config"]["vocab"] >= 10**8


def test_generation_is_deterministic_and_seeded(tmp_path: Path) -> None:
    cfg = PlantedConfig(rows=2000, seed=7, chunk_rows=512, drift_period=1000)
    a = generate(cfg, tmp_path / "a.tsv")
    b = generate(cfg, tmp_path / "b.tsv")
    assert (tmp_path / "a.tsv").read_bytes() == (tmp_path / "b.tsv").read_bytes()
    assert a.ceiling_auc == b.ceiling_auc
    generate(PlantedConfig(rows=2000, seed=8, chunk_rows=512), tmp_path / "c.tsv")
    assert (tmp_path / "a.tsv").read_bytes() != (tmp_path / "c.tsv").read_bytes()


def test_format_prints_exact_integers_and_empties_for_missing() -> None:
    dense = np.array([[0, 9, 10, 99, 100, 12345, 9_999_999_999, -1, 1, 7, 70, 700, 1_000_000_000]])
    cats = np.zeros((1, 26), np.uint32)
    cats[0, 0] = 0xDEADBEEF
    cats[0, 1] = 0x1
    missing = np.zeros((1, 26), bool)
    missing[0, 2] = True
    line = format_criteo(np.array([1], np.int8), dense, cats, missing).decode()
    f = line.rstrip("\n").split("\t")
    assert line.endswith("\n") and len(f) == 40
    assert f[:14] == ["1", "0", "9", "10", "99", "100", "12345", "9999999999", "", "1", "7",
                      "70", "700", "1000000000"]  # fmt: skip
    assert f[14:17] == ["deadbeef", "00000001", ""]


def test_planted_ceiling_is_high_and_a_fitted_lr_approaches_it(tmp_path: Path) -> None:
    cfg = PlantedConfig(rows=20_000, seed=3, zipf_min=2.0, zipf_max=3.0, chunk_rows=4096)
    res = generate(cfg, tmp_path / "d.tsv")
    assert res.ceiling_auc > 0.75
    prob = np.concatenate([c.prob for c in iter_planted(cfg)])
    labels, fields = parse(tmp_path / "d.tsv")
    x = design(fields)
    tr = 16_000
    lr = LogisticRegression(C=0.3, solver="liblinear").fit(x[:tr], labels[:tr])
    fitted = roc_auc_score(labels[tr:], lr.predict_proba(x[tr:])[:, 1])
    ceiling = roc_auc_score(labels[tr:], prob[tr:])
    assert abs(ceiling - res.ceiling_auc) < 0.02  # the streamed histogram AUC is the real one
    assert fitted <= ceiling + 0.01
    assert fitted >= ceiling - 0.04, (fitted, ceiling)


def test_drift_rotates_the_planted_weights(tmp_path: Path) -> None:
    """With half a turn over the data, a model of the first quarter is wrong on the last."""
    aucs = {}
    for period in (0, 40_000):
        cfg = PlantedConfig(
            rows=20_000, seed=5, zipf_min=1.5, zipf_max=2.5, drift_period=period, chunk_rows=4096
        )
        generate(cfg, tmp_path / "d.tsv")
        labels, fields = parse(tmp_path / "d.tsv")
        x = design(fields)
        lr = LogisticRegression(C=0.3, solver="liblinear").fit(x[:5000], labels[:5000])
        aucs[period] = roc_auc_score(labels[15_000:], lr.predict_proba(x[15_000:])[:, 1])
    assert aucs[0] > 0.7
    assert aucs[40_000] < 0.5, aucs


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="vocab"):
        PlantedConfig(rows=10, vocab=2**40)
    with pytest.raises(ValueError, match="rows"):
        PlantedConfig(rows=0)
    with pytest.raises(ValueError, match="zipf_exponents"):
        PlantedConfig(rows=10, zipf_exponents=(1.1, 1.2))


def test_cli_writes_data_and_reports_the_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.tsv"
    assert main(["--rows", "1500", "--out", str(out), "--seed", "2", "--drift", "1000"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["rows"] == 1500 and 0.5 < report["ceiling_auc"] < 1.0
    assert "rows/s" in captured.err
    assert len(out.read_text().splitlines()) == 1500
    with pytest.raises(SystemExit):
        main(["--rows", "-3", "--out", str(out)])
