"""Helpers for the coadapt.train tests: a fake context and bounded subprocess runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = Path(__file__).resolve().parent / "scripts" / "tiny_train.py"


class FakeContext:
    """Just what AdaptiveDataLoader needs: rank, world size and a state registry."""

    def __init__(self, rank: int = 0, world_size: int = 1, saved: dict | None = None) -> None:
        self.rank, self.world_size = rank, world_size
        self.saved = saved or {}
        self.registered: dict = {}
        self.memory_cap: int | None = None  # no per-replica batch learned from an OOM

    def register(self, name: str, obj: object) -> bool:
        self.registered[name] = obj
        if name in self.saved:
            obj.load_state_dict(self.saved[name])  # type: ignore[attr-defined]
            return True
        return False


def launch(replicas: int, ckpt: Path, log: Path, *args: str, timeout: float = 90.0) -> int:
    """Run the tiny script under run-local; kill the process group on timeout."""
    cmd = [
        sys.executable,
        "-m",
        "coadapt.train.launch",
        "-n",
        str(replicas),
        "--checkpoint-dir",
        str(ckpt),
        str(TINY),
        "--log",
        str(log),
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        print(out.decode(errors="replace"))
    return proc.returncode


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["PYTHONPATH"] = str(ROOT)
    return env


def read_log(log: Path) -> list[dict]:
    """The log's complete records. Tests poll a log while its job still writes it, so the last
    line may be half-written (CI once read a lone ``{``): only newline-terminated lines count."""
    text = log.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]
