"""A sparse job's shard servers as the controller runs them: where their files live, which
tables a model needs, and the command line of one shard.

Torch-free on purpose: the controller imports it to start a job's servers, and the online
trainer imports it to find them, so the layout is written in exactly one place.

Layout under a job's sparse directory (``ReplicaEnv.sparse_dir``)::

    servers/shard-<i>.json   the shard's ServerConfig       servers/shard-<i>.port  its port
    servers/run-<i>/         the executor's run files        ckpt/                   checkpoints
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from coadapt.sparse.server import ServerConfig, TableSpec

__all__ = ["MODELS", "JobLayout", "model_tables"]

MODELS = ("lr", "fm", "deepfm", "widedeep")
_FIELDS = 26  # Criteo's categorical fields C1..C26


def _names(prefix: str) -> list[str]:
    """The same names as :func:`coadapt.sparse.models.field_names` (tested)."""
    return [f"{prefix}{i + 1}" for i in range(_FIELDS)]


def model_tables(model: str, dim: int = 8) -> tuple[list[TableSpec], list[str]]:
    """The server tables a model needs and the per-field tables that keep the counters
    (the first-order weights: one row per feature value)."""
    if model == "lr":
        names = _names("lr_C")
        return [TableSpec(n, 1, "ftrl", {"alpha": 1.0}, counters=True) for n in names], names
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    pre = "fm_" if model == "fm" else "dfm_"
    hp = {"lr": 0.05, "init_scale": 0.01}
    wide = _names(pre + "w")
    specs = [TableSpec(n, 1, "adagrad", hp, counters=True) for n in wide]
    specs += [TableSpec(n, dim, "adagrad", hp) for n in _names(pre + "v")]
    return specs, wide


@dataclass(frozen=True)
class JobLayout:
    """Paths of one sparse job's servers and checkpoints under ``root``."""

    root: Path

    @property
    def servers_dir(self) -> Path:
        return self.root / "servers"

    @property
    def ckpt_dir(self) -> Path:
        return self.root / "ckpt"

    def port_file(self, shard: int) -> Path:
        return self.servers_dir / f"shard-{shard}.port"

    def config_file(self, shard: int) -> Path:
        return self.servers_dir / f"shard-{shard}.json"

    def run_dir(self, shard: int) -> Path:
        return self.servers_dir / f"run-{shard}"

    def write_config(self, shard: int, num_shards: int, model: str, dim: int) -> Path:
        """The shard's ServerConfig (written once; its tables follow the job's model)."""
        specs, _ = model_tables(model, dim)
        cfg = ServerConfig(specs, shard, num_shards, "127.0.0.1", 0, str(self.ckpt_dir.resolve()))
        self.servers_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        path = self.config_file(shard)
        path.write_text(cfg.to_json())
        return path

    def shard_argv(self, shard: int, python: str = sys.executable) -> tuple[str, ...]:
        """The command of one shard process (it loads the committed checkpoint at start)."""
        return (
            python,
            "-m",
            "coadapt.sparse.server",
            "--config",
            str(self.config_file(shard).resolve()),
            "--port-file",
            str(self.port_file(shard).resolve()),
        )
