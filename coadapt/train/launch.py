"""``coadapt run-local -n K script.py [args]``: K replicas of a training script on this machine.

It sets the torchrun-compatible environment plus coadapt's own, streams every replica's
output prefixed with its rank, forwards SIGINT/SIGTERM (a SIGTERM is how a job is asked to
checkpoint and exit for a rescale), and exits with the worst exit code. If one replica
fails, the others would hang in their next collective, so they are terminated (and killed
after a grace period).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

GRACE_S = 15.0


def free_port() -> int:
    """A TCP port that was free a moment ago (the rendezvous binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def replica_env(rank: int, replicas: int, port: int, job_id: str,
                checkpoint_dir: str | None, restarts: int = 0,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one local replica."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(replicas), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(replicas), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "COADAPT_JOB_ID": job_id, "COADAPT_NUM_NODES": "1",
        "COADAPT_RESTARTS": str(restarts), "PYTHONUNBUFFERED": "1",
    })
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if checkpoint_dir is not None:
        env["COADAPT_CHECKPOINT_DIR"] = str(Path(checkpoint_dir).resolve())
    return env


def _pump(stream: IO[bytes], prefix: str, out: IO[str]) -> None:
    for raw in iter(stream.readline, b""):
        out.write(prefix + raw.decode(errors="replace"))
        out.flush()
    stream.close()


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N -> 128 + N, like a shell


def launch(script: str, script_args: Sequence[str], replicas: int,
           checkpoint_dir: str | None = None, job_id: str | None = None,
           restarts: int = 0, out: IO[str] | None = None) -> int:
    """Run ``replicas`` copies of ``script`` and return the worst exit code."""
    if replicas < 1:
        raise ValueError(f"need at least one replica, got {replicas}")
    out = out if out is not None else sys.stdout
    port = free_port()
    job = job_id or os.environ.get("COADAPT_JOB_ID") or f"local-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    for rank in range(replicas):
        proc = subprocess.Popen(
            [sys.executable, script, *script_args],
            env=replica_env(rank, replicas, port, job, checkpoint_dir, restarts),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        stream = proc.stdout
        if stream is None:  # cannot happen with stdout=PIPE; keeps the types honest
            raise RuntimeError("replica has no stdout pipe")
        t = threading.Thread(target=_pump, args=(stream, f"[{rank}] ", out), daemon=True)
        t.start()
        pumps.append(t)

    def forward(signum: int, frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[int(sig)] = signal.signal(sig, forward)
    try:
        failed_at: float | None = None
        while any(p.poll() is None for p in procs):
            codes = [p.returncode for p in procs if p.returncode is not None]
            if failed_at is None and any(c != 0 for c in codes):
                failed_at = time.monotonic()
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for t in pumps:
        t.join(timeout=5)
    return max(_exit_code(p.returncode) for p in procs)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``run-local`` on a ``coadapt`` CLI sub-parser collection."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run-local", help="run K replicas of a training script on this machine",
        description=__doc__,
    )
    parser.add_argument("-n", "--replicas", type=int, default=1, help="number of replicas")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="directory for checkpoints (enables restart/rescale)")
    parser.add_argument("--job-id", default=None, help="job id reported with metrics")
    parser.add_argument("--restarts", type=int, default=0, help="restart count to report")
    parser.add_argument("script", help="training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    return launch(args.script, list(args.args), args.replicas, args.checkpoint_dir,
                  args.job_id, args.restarts)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m coadapt.train.launch -n 2 script.py``."""
    parser = argparse.ArgumentParser(prog="coadapt")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["run-local", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
