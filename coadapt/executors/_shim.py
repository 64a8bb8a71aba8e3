"""Replica supervisor: ``python -m coadapt.executors._shim RUN_DIR RANK [--sandbox CONF] -- ARGV``.

The controller may be killed at any moment while replicas keep training, and a process that
is not our child cannot be waited on. So every replica runs under this tiny supervisor, which
records its own PID and start time first (``rank<R>.pid``: a controller that crashed mid-launch
finds it), forwards SIGTERM/SIGINT to the training process, and writes the exit code
atomically to ``rank<R>.exit`` for whichever controller polls next. The training process gets
SIGKILL if the supervisor dies, so a replica can never outlive its record.

With ``--sandbox`` (a :class:`~coadapt.executors.sandbox.Confinement` as JSON) the supervisor,
which stays the controller's user and outside any namespace, makes the replica's memory cgroup,
starts the training process through the sandbox launcher, and on exit records whether the
replica ran out of memory (the cgroup's ``oom_kill`` counter, or exit code ``OOM_EXIT_CODE``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import FrameType

from coadapt.executors import memlimit
from coadapt.executors._proc import proc_start_ticks
from coadapt.executors.base import OOM_EXIT_CODE
from coadapt.executors.sandbox import Confinement, SandboxError, enter_pid_namespace

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


def _confine(
    conf: Confinement, run_dir: Path, rank: int, cmd: list[str]
) -> tuple[list[str], Path | None]:
    """The launcher command line for ``cmd``, and the replica's cgroup (made here)."""
    cgroup = None
    if conf.memory is not None:
        cgroup = memlimit.create(
            conf.memory, f"{run_dir.parent.parent.name}-{run_dir.name}-r{rank}-{os.getpid()}"
        )
    conf = replace(
        conf,
        cgroup=str(cgroup) if cgroup else None,
        outer_uid=os.getuid(),
        outer_gid=os.getgid(),
    )
    enter_pid_namespace(conf)
    launcher = [sys.executable, "-m", "coadapt.executors.sandbox", conf.to_json(), "--"]
    return [*launcher, *cmd], cgroup


def _outcome(code: int, cgroup: Path | None, conf: Confinement | None) -> dict[str, object]:
    """The exit record: code, reason, and whether the replica ran out of memory."""
    if code < 0:
        reason, code = f"killed by signal {-code}", 128 - code
    elif conf is not None and conf.namespace and 128 < code < 128 + signal.NSIG:
        reason = f"killed by signal {code - 128}"  # the sandbox's init reports it this way
    else:
        reason = "exited"
    oom = False
    if cgroup is not None and memlimit.oom_kills(cgroup) > 0:
        oom = True
        assert conf is not None and conf.memory is not None
        reason = (
            f"out of memory: killed by the kernel OOM killer at the replica's limit of "
            f"{conf.memory.limit_bytes >> 20} MiB ({conf.memory.mechanism}); {reason}"
        )
    elif code == OOM_EXIT_CODE:
        oom = True
        reason = f"out of memory: the training process exited with code {OOM_EXIT_CODE}"
    return {"code": code, "reason": reason, "oom": oom}


def main(argv: list[str]) -> int:
    conf: Confinement | None = None
    if len(argv) >= 4 and argv[2] == "--sandbox":
        conf = Confinement.from_json(argv[3])
        argv = [*argv[:2], *argv[4:]]
    if len(argv) < 4 or argv[2] != "--":
        print(
            "usage: python -m coadapt.executors._shim RUN_DIR RANK [--sandbox CONF] -- ARGV...",
            file=sys.stderr,
        )
        return 2
    run_dir, rank, cmd = Path(argv[0]), int(argv[1]), argv[3:]
    me = os.getpid()
    _write_atomic(
        run_dir / f"rank{rank}.pid", json.dumps({"pid": me, "start_ticks": proc_start_ticks(me)})
    )
    cgroup: Path | None = None
    if conf is not None:
        try:
            cmd, cgroup = _confine(conf, run_dir, rank, cmd)
        except (OSError, SandboxError, memlimit.MemoryLimitError) as exc:
            print(f"coadapt: cannot confine the replica: {exc}", file=sys.stderr, flush=True)
            _write_atomic(
                run_dir / f"rank{rank}.exit",
                json.dumps({"code": 126, "reason": f"cannot confine: {exc}"}),
            )
            return 126
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
        if cgroup is not None:
            memlimit.release(cgroup)
        _write_atomic(
            run_dir / f"rank{rank}.exit",
            json.dumps({"code": 127, "reason": f"cannot start: {exc}"}),
        )
        return 127
    child = children[0]
    for signum in pending:
        child.send_signal(signum)
    record = _outcome(child.wait(), cgroup, conf)
    if cgroup is not None:
        memlimit.release(cgroup)
    _write_atomic(run_dir / f"rank{rank}.exit", json.dumps(record))
    return int(str(record["code"]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
