"""``coadapt run-local -n K script.py [args]``: K replicas of a training script on this machine.

It sets the torchrun-compatible environment plus coadapt's own, streams every replica's
output prefixed with its rank, forwards SIGINT/SIGTERM (a SIGTERM is how a job is asked to
checkpoint and exit for a rescale), and exits with the worst exit code. If one replica
fails, the others would hang in their next collective, so they are terminated (and killed
after a grace period).

``--elastic`` keeps the job alive across rescales: on SIGUSR1 the launcher reads the new
replica count from the control file (``--control-file``, default ``<checkpoint-dir>/replicas``),
SIGTERMs the replicas (they checkpoint at the next step boundary and exit 0), and starts the
new ones on a fresh rendezvous port. Replicas are forked from a warm *zygote*
(:mod:`coadapt.train.zygote`) that has already imported torch, coadapt.train and the
``--preload`` modules, so a restart pays neither the interpreter start nor ``import torch``.

This module imports only the standard library (not torch, not numpy): the launcher must be
ready to spawn in milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
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
from typing import IO, Any, Protocol

from coadapt.ports import free_port
from coadapt.protocol import ENV_JOB_ID, ReplicaEnv

GRACE_S = 15.0
_POLL_S = 0.01
_PREFIX = "[launch] "


class LaunchError(RuntimeError):
    """The launcher cannot run the job (bad arguments, or the zygote died)."""


def replica_env(
    rank: int,
    replicas: int,
    port: int,
    job_id: str,
    checkpoint_dir: str | None,
    restarts: int = 0,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of one local replica: ``base`` (default: ours) plus its
    :class:`~coadapt.protocol.ReplicaEnv`."""
    env = dict(os.environ if base is None else base)
    wire = ReplicaEnv(
        rank=rank,
        world_size=replicas,
        local_rank=rank,
        local_world_size=replicas,
        master_port=port,
        job_id=job_id,
        num_nodes=1,
        restarts=restarts,
        checkpoint_dir=str(Path(checkpoint_dir).resolve()) if checkpoint_dir is not None else None,
    )
    env.update(wire.to_env())
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # A replica that dies in native code (a C++ terminate in a collective, a crash in an
    # extension) prints every thread's Python stack, so its log says where it was.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        with lock:
            out.write(prefix + raw.decode(errors="replace"))
            out.flush()
    stream.close()


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal N -> 128 + N, like a shell


class Replica(Protocol):
    """A running replica, whichever way it was started."""

    rank: int

    def poll(self) -> int | None: ...
    def send_signal(self, signum: int) -> None: ...


class _ColdReplica:
    """A replica started as a fresh interpreter (``python script.py``)."""

    def __init__(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        self.rank, self.proc = rank, proc

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)


class _ForkedReplica:
    """A replica forked by the zygote; the zygote reports its exit status."""

    def __init__(self, rank: int, zygote: ZygoteClient) -> None:
        self.rank, self.zygote = rank, zygote
        self.pid: int | None = None
        self.returncode: int | None = None
        self.early_signals: list[int] = []  # sent before the zygote told us the pid

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            self.zygote.signal(self, signum)


class ZygoteClient:
    """Launcher side of the warm fork server (see :mod:`coadapt.train.zygote`)."""

    def __init__(self, preload: Sequence[str], out: IO[str], lock: threading.Lock) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._out, self._out_lock = out, lock
        self._lock = threading.Lock()  # replica bookkeeping (the reader thread updates it)
        self._send_lock = threading.Lock()
        self.pumps: list[threading.Thread] = []
        self._pending: dict[int, _ForkedReplica] = {}
        self._by_pid: dict[int, _ForkedReplica] = {}
        self._next_id = 0
        self.alive = True
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "coadapt.train.zygote",
                "--fd",
                str(theirs.fileno()),
                "--preload",
                ",".join(preload),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        theirs.close()
        if self.proc.stdout is None:  # cannot happen with stdout=PIPE; keeps the types honest
            raise LaunchError("zygote has no stdout pipe")
        pump = threading.Thread(
            target=_pump, args=(self.proc.stdout, "[zygote] ", out, lock), daemon=True
        )
        pump.start()
        self.pumps.append(pump)
        self._reader = threading.Thread(target=self._read, name="coadapt-zygote", daemon=True)
        self._reader.start()

    def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        with self._send_lock:
            if fds:
                socket.send_fds(self._sock, [data], fds)
            else:
                self._sock.send(data)

    def spawn(
        self, rank: int, script: str, args: Sequence[str], env: dict[str, str], out: IO[str]
    ) -> _ForkedReplica:
        """Ask for one replica; its output is streamed like a cold replica's."""
        if not self.alive:
            raise LaunchError("the zygote has exited; cannot start replicas")
        replica = _ForkedReplica(rank, self)
        read_fd, write_fd = os.pipe()
        with self._lock:
            ident = self._next_id
            self._next_id += 1
            self._pending[ident] = replica
        try:
            self._send(
                {
                    "op": "spawn",
                    "id": ident,
                    "script": script,
                    "argv": list(args),
                    "env": env,
                    "cwd": os.getcwd(),
                },
                [write_fd],
            )
        except OSError as exc:
            os.close(read_fd)
            raise LaunchError(f"the zygote is gone: {exc}") from exc
        finally:
            os.close(write_fd)  # the child holds it now: EOF when the child exits
        stream = os.fdopen(read_fd, "rb")
        pump = threading.Thread(
            target=_pump, args=(stream, f"[{rank}] ", out, self._out_lock), daemon=True
        )
        pump.start()
        self.pumps.append(pump)
        return replica

    def signal(self, replica: _ForkedReplica, signum: int) -> None:
        with self._lock:
            if replica.pid is None:  # delivered when the zygote reports the pid
                replica.early_signals.append(int(signum))
                return
        if not self.alive:
            return
        with contextlib.suppress(OSError):
            self._send({"op": "signal", "pid": replica.pid, "signal": int(signum)})

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            event = msg.get("event")
            with self._lock:
                if event == "spawned":
                    replica = self._pending.pop(int(msg["id"]))
                    replica.pid = int(msg["pid"])
                    self._by_pid[replica.pid] = replica
                    early, replica.early_signals = replica.early_signals, []
                    for signum in early:
                        with contextlib.suppress(OSError):
                            self._send({"op": "signal", "pid": replica.pid, "signal": signum})
                elif event == "exit":
                    done = self._by_pid.pop(int(msg["pid"]), None)
                    if done is not None:
                        done.returncode = int(msg["code"])
        with self._lock:  # the zygote died: nobody will report these replicas' exits
            self.alive = False
            for replica in [*self._pending.values(), *self._by_pid.values()]:
                if replica.returncode is None:
                    replica.returncode = 1
            self._pending.clear()
            self._by_pid.clear()

    def close(self, timeout_s: float = GRACE_S) -> None:
        """Close the socket; the zygote then ends its children (if any) and exits."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=1.0)


class LocalJob:
    """One run-local job: K replicas, restarted at another K on request when elastic."""

    def __init__(
        self,
        script: str,
        script_args: Sequence[str],
        replicas: int,
        checkpoint_dir: str | None = None,
        job_id: str | None = None,
        restarts: int = 0,
        out: IO[str] | None = None,
        *,
        zygote: bool = False,
        preload: Sequence[str] = (),
        elastic: bool = False,
        control_file: str | None = None,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"need at least one replica, got {replicas}")
        if elastic and control_file is None and checkpoint_dir is None:
            raise LaunchError(
                "--elastic needs --checkpoint-dir or --control-file (where the "
                "new replica count is read from)"
            )
        self.script, self.script_args = script, list(script_args)
        self.replicas, self.restarts = replicas, restarts
        self.checkpoint_dir = checkpoint_dir
        self.job_id = job_id or os.environ.get(ENV_JOB_ID) or f"local-{uuid.uuid4().hex[:8]}"
        self.out: IO[str] = out if out is not None else sys.stdout
        self.elastic = elastic
        self.control_file = (
            Path(control_file)
            if control_file is not None
            else (Path(checkpoint_dir) / "replicas" if checkpoint_dir is not None else None)
        )
        self._lock = threading.Lock()
        self._zygote = ZygoteClient(preload, self.out, self._lock) if zygote else None
        self._procs: list[Replica] = []
        self._pumps: list[threading.Thread] = []
        self._rescale_to: int | None = None
        self._forward: list[int] = []
        self._stopping = False

    # -- requests (signal handlers and other threads only set flags) -------------------------
    def request_rescale(self, replicas: int | None = None) -> None:
        """Restart at ``replicas`` (None: read the control file) at the next loop turn."""
        self._rescale_to = replicas if replicas is not None else 0

    def _on_usr1(self, signum: int, frame: FrameType | None) -> None:
        self.request_rescale()

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True
        self._forward.append(signum)

    def _say(self, text: str) -> None:
        with self._lock:
            self.out.write(_PREFIX + text + "\n")
            self.out.flush()

    # -- replicas ---------------------------------------------------------------------------
    def _start(self) -> None:
        port = free_port()
        self._procs = []
        for rank in range(self.replicas):
            env = replica_env(
                rank, self.replicas, port, self.job_id, self.checkpoint_dir, self.restarts
            )
            if self._zygote is not None:
                script = str(Path(self.script).resolve())
                self._procs.append(
                    self._zygote.spawn(rank, script, self.script_args, env, self.out)
                )
                continue
            proc = subprocess.Popen(
                [sys.executable, self.script, *self.script_args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            if proc.stdout is None:  # cannot happen with stdout=PIPE
                raise LaunchError("replica has no stdout pipe")
            pump = threading.Thread(
                target=_pump, args=(proc.stdout, f"[{rank}] ", self.out, self._lock), daemon=True
            )
            pump.start()
            self._pumps.append(pump)
            self._procs.append(_ColdReplica(rank, proc))

    def _signal_all(self, signum: int) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signum)

    def _wait_all(self, deadline_s: float) -> None:
        """Wait for every replica to exit; SIGKILL whatever is left after ``deadline_s``."""
        deadline = time.monotonic() + deadline_s
        while any(p.poll() is None for p in self._procs):
            if time.monotonic() > deadline:
                self._signal_all(signal.SIGKILL)
                deadline = float("inf")
            time.sleep(_POLL_S)

    def _target(self) -> int | None:
        requested, self._rescale_to = self._rescale_to, None
        if requested:
            return requested
        if self.control_file is None:
            self._say("rescale requested but there is no control file; ignored")
            return None
        try:
            value = int(self.control_file.read_text().strip())
        except (OSError, ValueError) as exc:
            self._say(
                f"cannot read the replica count from {self.control_file}: {exc}; rescale ignored"
            )
            return None
        if value < 1:
            self._say(f"{self.control_file} asks for {value} replicas; rescale ignored")
            return None
        return value

    def _rescale(self, replicas: int) -> int | None:
        """Stop the replicas (they checkpoint) and start ``replicas`` new ones.

        Returns an exit code when the job must end instead (a replica failed to stop cleanly).
        """
        self._say(f"rescale {self.replicas} -> {replicas} replicas")
        self._signal_all(signal.SIGTERM)
        self._wait_all(GRACE_S)
        # Killed by our SIGTERM before it installed its handler (still starting) is fine:
        # it had no progress to lose and the checkpoint on disk is atomic.
        codes = [p.poll() for p in self._procs]
        if self._stopping:  # SIGINT/SIGTERM arrived meanwhile: end the job, do not restart
            return max(_exit_code(c) for c in codes if c is not None)
        bad = [c for c in codes if c not in (0, -signal.SIGTERM)]
        if bad:
            self._say(f"replicas did not stop cleanly ({codes}); not restarting")
            return max(_exit_code(c) for c in bad if c is not None)
        self.replicas = replicas
        self.restarts += 1
        self._start()
        return None

    # -- the job ----------------------------------------------------------------------------
    def run(self) -> int:
        """Run until the replicas finish; return the worst exit code."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[int(sig)] = signal.signal(sig, self._on_stop)
            if self.elastic:
                previous[int(signal.SIGUSR1)] = signal.signal(signal.SIGUSR1, self._on_usr1)
        try:
            self._start()
            return self._loop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if self._zygote is not None:
                self._zygote.close()
                self._pumps.extend(self._zygote.pumps)
            for pump in self._pumps:  # the output is complete when run() returns
                pump.join(timeout=5.0)

    def _loop(self) -> int:
        failed_at: float | None = None
        while True:
            while self._forward:
                self._signal_all(self._forward.pop(0))
            if self._rescale_to is not None and not self._stopping and failed_at is None:
                target = self._target()
                if target is not None:
                    code = self._rescale(target)
                    if code is not None:
                        return code
                continue
            codes = [p.poll() for p in self._procs]
            if all(c is not None for c in codes):
                return max(_exit_code(c) for c in codes if c is not None)
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.monotonic()
                self._signal_all(signal.SIGTERM)
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                self._signal_all(signal.SIGKILL)
            time.sleep(_POLL_S)


def launch(
    script: str,
    script_args: Sequence[str],
    replicas: int,
    checkpoint_dir: str | None = None,
    job_id: str | None = None,
    restarts: int = 0,
    out: IO[str] | None = None,
    *,
    zygote: bool = False,
    preload: Sequence[str] = (),
    elastic: bool = False,
    control_file: str | None = None,
) -> int:
    """Run ``replicas`` copies of ``script`` and return the worst exit code."""
    job = LocalJob(
        script,
        script_args,
        replicas,
        checkpoint_dir,
        job_id,
        restarts,
        out,
        zygote=zygote or elastic,
        preload=preload,
        elastic=elastic,
        control_file=control_file,
    )
    return job.run()


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``run-local`` on a ``coadapt`` CLI sub-parser collection."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run-local",
        help="run K replicas of a training script on this machine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--replicas", type=int, default=1, help="number of replicas")
    parser.add_argument(
        "--checkpoint-dir", default=None, help="directory for checkpoints (enables restart/rescale)"
    )
    parser.add_argument("--job-id", default=None, help="job id reported with metrics")
    parser.add_argument("--restarts", type=int, default=0, help="restart count to report")
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="stay up across rescales: SIGUSR1 restarts the job at the "
        "replica count in the control file (implies --zygote)",
    )
    parser.add_argument(
        "--control-file",
        default=None,
        help="file holding the replica count to rescale to on SIGUSR1 "
        "(default: <checkpoint-dir>/replicas)",
    )
    parser.add_argument(
        "--zygote",
        action="store_true",
        help="fork replicas from a warm process that has imported torch "
        "once (faster start, one import for all replicas)",
    )
    parser.add_argument(
        "--preload",
        default="",
        help="comma-separated modules the zygote imports before forking (e.g. sklearn.datasets)",
    )
    parser.add_argument("script", help="training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    preload = [m.strip() for m in args.preload.split(",") if m.strip()]
    try:
        return launch(
            args.script,
            list(args.args),
            args.replicas,
            args.checkpoint_dir,
            args.job_id,
            args.restarts,
            zygote=args.zygote,
            preload=preload,
            elastic=args.elastic,
            control_file=args.control_file,
        )
    except LaunchError as exc:
        print(f"coadapt run-local: {exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m coadapt.train.launch -n 2 script.py``."""
    parser = argparse.ArgumentParser(prog="coadapt")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["run-local", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
