"""Training one configuration of a task for real (torch, CPU): the curves a bank records, and
the trial program that ``--live`` runs (``tune_tenants.py --trial <bank>:<task> --lr ...``)."""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from _tune.tasks import LOSS_CAP, task_def


def _data(name: str, augment: int = 0) -> tuple[Any, Any, Any, Any]:
    """Standardised train/held-out split (25%, stratified, seed 0); with ``augment``, the
    training set enlarged deterministically (seed 0) to about that many samples."""
    import numpy as np
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    loader = {
        "digits": datasets.load_digits,
        "breast_cancer": datasets.load_breast_cancer,
        "wine": datasets.load_wine,
    }[name]
    x, y = loader(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    if augment:
        rng = np.random.default_rng(0)
        if name == "digits":  # images: every ±1-pixel shift (zero fill), then pixel noise
            img = xtr.reshape(-1, 8, 8)
            shifted = []
            for dy, dx in itertools.product((-1, 0, 1), repeat=2):
                s = np.zeros_like(img)
                s[:, max(dy, 0) : 8 + min(dy, 0), max(dx, 0) : 8 + min(dx, 0)] = img[
                    :, max(-dy, 0) : 8 + min(-dy, 0), max(-dx, 0) : 8 + min(-dx, 0)
                ]
                shifted.append(s.reshape(len(img), 64))
            reps = max(round(augment / (9 * len(xtr))), 1)
            base = np.concatenate(shifted * reps)
            xtr = np.clip(base + rng.normal(0.0, 1.0, base.shape), 0.0, 16.0)
            ytr = np.tile(ytr, 9 * reps)
        else:  # tabular: Gaussian jitter of 0.3 standard deviations per feature
            sd = xtr.std(axis=0, keepdims=True)
            reps = max(round(augment / len(xtr)), 1)
            base = np.concatenate([xtr] * reps)
            xtr = base + rng.normal(0.0, 0.3, base.shape) * sd
            ytr = np.tile(ytr, reps)
    scaler = StandardScaler().fit(xtr)
    return (
        scaler.transform(xtr).astype(np.float32),
        scaler.transform(xte).astype(np.float32),
        ytr.astype(np.int64),
        yte.astype(np.int64),
    )


def _model(kind: str, features: int, classes: int, params: dict[str, Any]) -> Any:
    from torch import nn

    if kind == "mlp":
        h = params["hidden"]
        return nn.Sequential(nn.Linear(features, h), nn.ReLU(), nn.Linear(h, classes))
    if kind == "mlp2":
        h = params["hidden"]
        return nn.Sequential(
            nn.Linear(features, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, classes)
        )
    c = params["channels"]
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c * 16, classes),
        )
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * c * 16, 64),
        nn.ReLU(),
        nn.Linear(64, classes),
    )


def train_epochs(
    task: str, params: dict[str, Any], clock: Callable[[], float] = time.perf_counter
) -> Iterator[tuple[float, float, float]]:
    """Train one configuration; yield (held-out accuracy, held-out log-loss, seconds by
    ``clock``) after each epoch. The log-loss is the mean cross-entropy (nats) of the held-out
    split; a non-finite one (a diverged model) is reported as ``LOSS_CAP``."""
    import torch
    from torch import nn

    td = task_def(task)
    xtr, xte, ytr, yte = _data(td.dataset, td.augment)
    torch.manual_seed(0)
    classes = int(ytr.max()) + 1
    xtr_t, xte_t = torch.from_numpy(xtr), torch.from_numpy(xte)
    ytr_t, yte_t = torch.from_numpy(ytr), torch.from_numpy(yte)
    if td.model.startswith("cnn"):
        xtr_t, xte_t = xtr_t.view(-1, 1, 8, 8), xte_t.view(-1, 1, 8, 8)
    model = _model(td.model, xtr.shape[1], classes, params)
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params.get("momentum", 0.9))
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    bs = params["batch_size"]
    for _ in range(td.epochs):
        started = clock()
        model.train()
        perm = torch.randperm(len(xtr_t), generator=gen)
        for i in range(0, len(perm), bs):
            idx = perm[i : i + bs]
            opt.zero_grad()
            loss = loss_fn(model(xtr_t[idx]), ytr_t[idx])
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            logits = model(xte_t)
            acc = float((logits.argmax(1) == yte_t).float().mean())
            loss = float(loss_fn(logits, yte_t))
        yield (
            (acc if math.isfinite(acc) else 0.0),
            (min(loss, LOSS_CAP) if math.isfinite(loss) else LOSS_CAP),
            clock() - started,
        )


def train_config(
    task: str, params: dict[str, Any], clock: Callable[[], float] = time.perf_counter
) -> tuple[list[float], list[float], list[float]]:
    """Train one configuration; per-epoch held-out accuracy, held-out log-loss and epoch
    seconds."""
    rows = list(train_epochs(task, params, clock))
    return [a for a, _, _ in rows], [lo for _, lo, _ in rows], [s for _, _, s in rows]


def run_trial(task: str, argv: list[str]) -> int:
    """The trial program of ``--live``: train one configuration, report each epoch."""
    import torch

    import coadapt.train as train

    torch.set_num_threads(1)
    space = task_def(task).space
    raw = dict(zip(argv[::2], argv[1::2], strict=False))
    params: dict[str, Any] = {}
    for name, choices in space.items():
        text = raw.get(f"--{name}")
        match = [c for c in choices if str(c) == text or repr(c) == text]
        if not match:
            print(f"--{name}: {text!r} is not one of {choices}", file=sys.stderr)
            return 2
        params[name] = match[0]
    ctx = train.init()
    for epoch, (acc, loss, _) in enumerate(train_epochs(task, params), 1):
        train.report("accuracy", acc, step=epoch)
        train.report("loss", loss, step=epoch)
        print(f"epoch {epoch}: accuracy {acc:.4f} loss {loss:.4f}", flush=True)
        if ctx.stop_requested:
            break
    train.shutdown()
    return 0
