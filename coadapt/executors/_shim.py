"""Replica supervisor: ``python -m coadapt.executors._shim RUN_DIR RANK -- ARGV...``.

The controller may be killed at any moment while replicas keep training, and a process that
is not our child cannot be waited on. So every replica runs under this tiny supervisor, which
records its own PID and start time first (``rank<R>.pid``: a controller that crashed mid-launch
finds it), forwards SIGTERM/SIGINT to the training process, and writes the exit code
atomically to ``rank<R>.exit`` for whichever controller polls next. The training process gets
SIGKILL if the supervisor dies, so a replica can never outlive its record.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from coadapt.executors._proc import proc_start_ticks

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: best effort
        pass


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m coadapt.executors._shim RUN_DIR RANK -- ARGV...", file=sys.stderr)
        return 2
    run_dir, rank, cmd = Path(argv[0]), int(argv[1]), argv[3:]
    me = os.getpid()
    _write_atomic(
        run_dir / f"rank{rank}.pid", json.dumps({"pid": me, "start_ticks": proc_start_ticks(me)})
    )
    children: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        # A signal that arrives before the child exists is delivered right after it starts.
        if not children:
            pending.append(signum)
        elif children[0].poll() is None:
            children[0].send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        children.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))
    except OSError as exc:
        print(f"coadapt: cannot start {cmd[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write_atomic(
            run_dir / f"rank{rank}.exit",
            json.dumps({"code": 127, "reason": f"cannot start: {exc}"}),
        )
        return 127
    child = children[0]
    for signum in pending:
        child.send_signal(signum)
    code = child.wait()
    if code < 0:
        reason, code = f"killed by signal {-code}", 128 - code
    else:
        reason = "exited"
    _write_atomic(run_dir / f"rank{rank}.exit", json.dumps({"code": code, "reason": reason}))
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
