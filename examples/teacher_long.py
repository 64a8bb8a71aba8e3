"""A long training where the batch size matters: an MLP student learns a random ReLU teacher.

Issue 19's first time-to-accuracy races ended in under a second, so the adaptive job's first
40-50 steps (profiling, noise measurement) were most of its run. Here the user's batch (32,
LR 0.02, SGD + momentum) needs ~5000 steps to 70% test accuracy: seconds at one replica, tens
of seconds at two (each step there pays an all-reduce). The data is generated (no download):
x ~ N(0, I) in 32 dimensions, labels sampled from softmax(teacher(x) / 0.3) where the teacher
is a fixed random 32-64-64-10 ReLU network, so the task is learnable (Bayes accuracy ~88%)
and has real label noise, hence real gradient noise that grows relative to the gradient as
training converges. 131072 training samples keep it from overfitting within the race, and
8192 test samples keep the accuracy's sampling noise near 0.5%. The student is small per
sample, so on a CPU its throughput grows with the batch (the step's fixed cost dominates).

    coadapt run-local -n 2 --checkpoint-dir /tmp/ck examples/teacher_long.py --epochs 3
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from teacher_mlp import main as train_student  # the script's folder is on sys.path
from teacher_mlp import student
from torch.utils.data import TensorDataset

__all__ = ["data", "main", "student"]  # the same student as examples/teacher_mlp.py

DIM, CLASSES, HIDDEN = 32, 10, 64
TASK_SEED = 1234  # the teacher and the data are fixed; --seed changes init and order only
TEMPERATURE, LOGIT_STD = 0.3, 3.0


def data(
    n_train: int = 131072, n_test: int = 8192
) -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    """(train set, test inputs, test labels) from the fixed random ReLU teacher."""
    g = torch.Generator().manual_seed(TASK_SEED)
    w1 = torch.randn(DIM, HIDDEN, generator=g) * (2 / DIM) ** 0.5
    w2 = torch.randn(HIDDEN, HIDDEN, generator=g) * (2 / HIDDEN) ** 0.5
    w3 = torch.randn(HIDDEN, CLASSES, generator=g) * (1 / HIDDEN) ** 0.5
    x = torch.randn(n_train + n_test, DIM, generator=g)
    logits = torch.relu(torch.relu(x @ w1) @ w2) @ w3
    logits = logits / logits.std() * LOGIT_STD
    probs = F.softmax(logits / TEMPERATURE, dim=1)
    y = torch.multinomial(probs, 1, generator=g).squeeze(1)
    return TensorDataset(x[:n_train], y[:n_train]), x[n_train:], y[n_train:]


def main() -> None:
    """The teacher example's training loop on this teacher, with this workload's defaults."""
    train_student(data, epochs=3, lr=0.02, retune_every=50, description=__doc__)


if __name__ == "__main__":
    main()
