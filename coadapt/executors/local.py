"""Replicas as processes on this machine: the GPUs are the slots, or N CPU slots.

Each replica runs under :mod:`coadapt.executors._shim` in its own session (so a controller
crash or Ctrl-C does not take training down with it), with stdout and stderr appended to its
log file. Status comes from the shim's exit file, so a restarted controller can poll
replicas it did not start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from coadapt.executors._proc import proc_start_ticks, proc_state
from coadapt.executors.base import (
    OOM_EXIT_CODE,
    ExecutorError,
    NodeInventory,
    ReplicaHandle,
    ReplicaPhase,
    ReplicaSpec,
    ReplicaStatus,
    launch_each,
)
from coadapt.executors.gpu_types import DEFAULT_GPU_TYPE, check_type_name, device_type
from coadapt.executors.sandbox import Confinement, Isolation
from coadapt.protocol import (
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_TENANT,
    ENV_WARM,
    ENV_WORLD_SIZE,
)

NODE_NAME = "local"
#: Seconds a job's zygote waits with no replica before it exits (between attempts it waits).
ZYGOTE_IDLE_S = 60.0
#: Seconds a sandboxed zygote may take to start listening (within them it is not restarted).
ZYGOTE_START_S = 30.0
#: Variables libraries read at import time: replicas differing in them need their own zygote.
_IMPORT_TIME_ENV = (
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "PYTHONHASHSEED",
    ENV_TENANT,
)
#: Per-replica variables the zygote must not carry (each fork gets the replica's own).
_PER_REPLICA_ENV = (ENV_RANK, ENV_LOCAL_RANK, ENV_WORLD_SIZE, ENV_MASTER_ADDR, ENV_MASTER_PORT)


def _listening(path: str) -> bool:
    """A zygote accepts on ``path`` (a stale socket file of a dead one does not)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
    except OSError:
        return False
    finally:
        s.close()
    return True


def detect_gpus() -> int:
    """Number of NVIDIA GPUs (``nvidia-smi -L``), without importing torch (slow)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(_smi_names())


def _smi_names() -> list[str]:
    """Device names by index (``nvidia-smi --query-gpu=name``); empty without the driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def detect_gpu_types() -> list[str]:
    """The GPU type of each device this process may use, in CUDA's order (the position is
    the index a replica's ``CUDA_VISIBLE_DEVICES`` names); a device whose name cannot be
    read (a UUID in ``CUDA_VISIBLE_DEVICES``) is :data:`DEFAULT_GPU_TYPE`."""
    count = detect_gpus()
    names = _smi_names()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [device_type(n) for n in names[:count]]
    out = []
    for d in (d.strip() for d in visible.split(",")):
        if not d or d == "-1":
            continue
        idx = int(d) if d.isdigit() else -1
        out.append(device_type(names[idx]) if 0 <= idx < len(names) else DEFAULT_GPU_TYPE)
    return out


def plan_nodes(
    slots: int | Mapping[str, int] | None, device_types: Sequence[str]
) -> tuple[bool, list[tuple[str, str, list[int]]]]:
    """This machine's nodes as (name, GPU type, device index of each slot), and whether the
    slots are GPUs. ``slots``: a count (CPU slots, as before types), slots per declared type
    (GPUs when the machine has them, in device order, else CPU slots so labelled), or None
    (the GPUs by detected type, else one CPU slot per core of type ``gpu``). One type is the
    node ``local``; several are one node ``local-TYPE`` each, so a job (on one type at a
    time) never spans two."""
    if isinstance(slots, int):
        if slots < 1:
            raise ExecutorError(f"need at least one slot, got {slots}")
        return False, [(NODE_NAME, DEFAULT_GPU_TYPE, list(range(slots)))]
    if slots is None:
        if not device_types:
            cpus = os.cpu_count() or 1
            return False, [(NODE_NAME, DEFAULT_GPU_TYPE, list(range(cpus)))]
        by_type: dict[str, list[int]] = {}
        for i, t in enumerate(device_types):
            by_type.setdefault(t, []).append(i)
        gpus = True
    else:
        if not slots or any(n < 1 for n in slots.values()):
            raise ExecutorError(f"--slots: each type needs at least one slot, got {dict(slots)}")
        for t in slots:
            try:
                check_type_name(t)
            except ValueError as exc:
                raise ExecutorError(f"--slots: {exc}") from None
        total = sum(slots.values())
        gpus = bool(device_types)
        if gpus and total > len(device_types):
            raise ExecutorError(
                f"--slots declares {total} GPUs ({_fmt(slots)}) but this machine has "
                f"{len(device_types)}; declare at most that many"
            )
        by_type, start = {}, 0
        for t, n in slots.items():
            by_type[t] = list(range(start, start + n))
            start += n
    if len(by_type) == 1:
        ((t, devices),) = by_type.items()
        return gpus, [(NODE_NAME, t, devices)]
    return gpus, [(f"{NODE_NAME}-{t}", t, devices) for t, devices in by_type.items()]


def _fmt(slots: Mapping[str, int]) -> str:
    return ",".join(f"{t}:{n}" for t, n in slots.items())


def _alive(handle: ReplicaHandle) -> bool:
    """The process exists, is not a zombie, and is the one we started (same start time)."""
    ticks = proc_start_ticks(handle.pid)
    if ticks is None:
        if Path("/proc").is_dir():
            return False
        try:  # no procfs: fall back to a plain existence check
            os.kill(handle.pid, 0)
        except OSError:
            return False
        return True
    if handle.start_ticks is not None and ticks != handle.start_ticks:
        return False  # the PID was reused by another process
    return proc_state(handle.pid) not in (None, "Z", "X")


class LocalExecutor:
    """Runs replicas as supervised processes on this machine."""

    name = "local"
    shares_slots = True  # a packed guest's replica runs on its host's devices or slot

    def __init__(
        self,
        slots: int | Mapping[str, int] | None = None,
        python: str | None = None,
        isolation: Isolation | None = None,
        warm: bool = True,
        device_types: Sequence[str] | None = None,
    ) -> None:
        if device_types is None:
            device_types = detect_gpu_types() if not isinstance(slots, int) else []
        self._gpus, plan = plan_nodes(slots, device_types)
        self._nodes = [NodeInventory(name, len(devs), t) for name, t, devs in plan]
        # Slot index on a node -> CUDA device index (several types: one node per type).
        self._devices = {name: devs for name, _, devs in plan}
        self._slots = sum(n.slots for n in self._nodes)
        self.python = python or sys.executable
        # Confinement of every replica (coadapt.executors.sandbox); none by default.
        self.isolation = isolation or Isolation()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # Fork coadapt.train replicas from a per-job warm zygote (see warm_zygote); with
        # isolation the zygote runs inside the job's sandbox, so its forks are confined too.
        self.warm = warm
        # Sandboxed zygotes this executor started (socket -> monotonic start time): one that
        # is not listening yet must not be started twice by the next replica of its group.
        self._zygotes: dict[str, float] = {}

    def nodes(self) -> list[NodeInventory]:
        """This machine: the node ``local``, or one node ``local-TYPE`` per GPU type."""
        return list(self._nodes)

    def slots(self) -> int:
        return self._slots

    def uses_gpus(self) -> bool:
        return self._gpus

    def launch_group(self, specs: Sequence[ReplicaSpec]) -> list[ReplicaHandle | ExecutorError]:
        return launch_each(self.launch, specs)

    def retain(self, run_dirs: Collection[str]) -> None:
        """Nothing is held beyond the processes themselves."""

    def launch(self, spec: ReplicaSpec) -> ReplicaHandle:
        cwd = Path(spec.cwd)
        if not cwd.is_dir():
            raise ExecutorError(f"working_dir {spec.cwd!r} does not exist")
        if not spec.argv:
            raise ExecutorError("empty command")
        run_dir = Path(spec.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (f"rank{spec.rank}.exit", f"rank{spec.rank}.pid"):
            (run_dir / stale).unlink(missing_ok=True)
        log_path = Path(spec.log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [self.python, "-m", "coadapt.executors._shim", str(run_dir), str(spec.rank)]
        conf: Confinement | None = None
        if self.isolation.active:
            tenant = spec.env.get(ENV_TENANT)
            conf = self.isolation.confinement(spec.job_id, tenant, spec.cwd)
            if conf.namespace and spec.expose:
                conf = replace(conf, expose=(*conf.expose, *spec.expose))
            self._hand_over(spec, conf.uid, conf.gid)
            argv += ["--sandbox", conf.to_json()]
        zygote = self.warm_zygote(spec, conf)
        if zygote is not None:
            argv += ["--zygote", zygote]
        argv += ["--", *spec.argv]
        env = dict(spec.env)
        devices = self._devices.get(spec.node)
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if self._gpus and visible and devices is not None:
            # The node's slot indices -> this machine's device indices (one node per type).
            try:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(
                    str(devices[int(s)]) for s in visible.split(",")
                )
            except (ValueError, IndexError):
                raise ExecutorError(
                    f"CUDA_VISIBLE_DEVICES={visible!r} names no slot of node {spec.node!r}"
                ) from None
        # The shim itself must import coadapt even when the job's cwd/PYTHONPATH hides it.
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), pkg_root) if p)
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash logs its Python stacks
        with open(log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ExecutorError(f"cannot start replica: {exc}") from exc
        self._children[proc.pid] = proc
        return ReplicaHandle(proc.pid, proc_start_ticks(proc.pid), str(run_dir), spec.rank)

    def warm_zygote(self, spec: ReplicaSpec, conf: Confinement | None = None) -> str | None:
        """The socket of the job's warm zygote, started if needed; None: start cold.

        Only a ``python SCRIPT.py ...`` replica whose script imports ``coadapt.train`` goes
        warm (others would pay torch's import for nothing), and not with ``ENV_WARM=0`` in
        its environment. One zygote per job, interpreter, working directory, confinement and
        import-time environment, found again by its socket path (so a restarted controller
        reuses it); it exits on its own once idle (no replica) for ``ZYGOTE_IDLE_S``. With a
        confinement ``conf`` the zygote runs inside it (see :meth:`_start_sandboxed_zygote`).
        """
        now = time.monotonic()
        for started, since in list(self._zygotes.items()):
            if now - since > ZYGOTE_START_S:
                del self._zygotes[started]
        if not self.warm or spec.env.get(ENV_WARM, "1") == "0" or len(spec.argv) < 2:
            return None
        exe, script = spec.argv[0], spec.argv[1]
        if not Path(exe).name.startswith("python") or not script.endswith(".py"):
            return None
        path = Path(script) if Path(script).is_absolute() else Path(spec.cwd) / script
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if "coadapt.train" not in f.read(1 << 16):
                    return None
        except OSError:
            return None
        key_env = {k: spec.env.get(k) for k in _IMPORT_TIME_ENV}
        sandbox = conf.to_json() if conf is not None else None
        key = json.dumps(
            [str(Path(spec.run_dir).parent), exe, spec.cwd, key_env, sandbox], sort_keys=True
        ).encode()
        sock_dir = Path(tempfile.gettempdir()) / f"coadapt-zygotes-{os.getuid()}"
        sock_dir.mkdir(mode=0o700, exist_ok=True)
        sock = str(sock_dir / f"{hashlib.sha256(key).hexdigest()[:20]}.sock")
        if sock in self._zygotes or _listening(sock):
            return sock
        env = dict(spec.env)
        for var in _PER_REPLICA_ENV:
            env.pop(var, None)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), pkg_root) if p)
        log = Path(spec.run_dir).parent / "zygote.log"
        idle, watch = str(ZYGOTE_IDLE_S), str(Path(spec.run_dir).parent)
        server = [exe, "-m", "coadapt.train.zygote", "--listen", sock]
        server += ["--idle-exit", idle, "--watch", watch]
        if conf is not None:
            return self._start_sandboxed_zygote(spec, conf, sock, server, env, log)
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    server,
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError:
            return None  # the replica starts cold
        try:  # it binds before importing torch, then detaches (the server goes on)
            code = proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
        return sock if code == 0 and Path(sock).exists() else None

    def _start_sandboxed_zygote(
        self,
        spec: ReplicaSpec,
        conf: Confinement,
        sock: str,
        server: list[str],
        env: dict[str, str],
        log: Path,
    ) -> str | None:
        """Start the job's zygote the way a cold replica of the job starts: under the shim
        with the job's confinement (PID and mount namespaces, run-as user, no_new_privs, a
        memory cgroup of its own). The run-as user cannot bind in our socket directory, so
        the socket is bound here and inherited (the zygote listens on it)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)
            old = os.umask(0o077)
            try:
                listener.bind(sock)
            finally:
                os.umask(old)
            fd = listener.fileno()
            run_dir = Path(spec.run_dir).parent / "zygote"
            run_dir.mkdir(exist_ok=True)
            run_dir.chmod(0o700)
            argv = [self.python, "-m", "coadapt.executors._shim", str(run_dir), "0"]
            argv += ["--sandbox", conf.to_json(), "--keep-fd", str(fd), "--detach"]
            argv += ["--cleanup", sock, "--"]  # the confined zygote cannot unlink it itself
            argv += [*server, "--bound-fd", str(fd)]
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    argv,
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(fd,),
                )
            code = proc.wait(timeout=30.0)  # the supervisor detaches at once
        except (OSError, subprocess.TimeoutExpired):
            return None  # the replica starts cold
        finally:
            listener.close()
        if code != 0:
            return None
        self._zygotes[sock] = time.monotonic()
        return sock

    def _hand_over(self, spec: ReplicaSpec, uid: int | None, gid: int | None) -> None:
        """The job's directory and checkpoints belong to the run-as user; its run files and
        logs stay the controller's (a replica cannot forge its own exit record)."""
        if uid is None or gid is None or self.isolation.jobs_root is None:
            return
        job_dir = Path(self.isolation.jobs_root) / spec.job_id
        Path(spec.run_dir).chmod(0o700)
        Path(spec.run_dir).parent.chmod(0o700)
        Path(spec.log_path).parent.chmod(0o750)
        if not job_dir.is_dir():
            return
        mine = [job_dir, job_dir / "checkpoints"]
        for top in mine[1:]:
            if top.is_dir():
                mine += [Path(root) / n for root, dirs, files in os.walk(top) for n in dirs + files]
        for path in mine:
            try:
                st = path.lstat()
                if (st.st_uid, st.st_gid) != (uid, gid):
                    os.chown(path, uid, gid, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ExecutorError(f"cannot hand {path} to uid {uid}: {exc}") from exc

    def _exit_record(self, handle: ReplicaHandle) -> ReplicaStatus | None:
        path = Path(handle.run_dir) / f"rank{handle.rank}.exit"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        code = int(data["code"])
        oom = bool(data.get("oom", code == OOM_EXIT_CODE))
        return ReplicaStatus(ReplicaPhase.EXITED, code, str(data.get("reason", "")), oom=oom)

    def poll(self, handle: ReplicaHandle) -> ReplicaStatus:
        child = self._children.get(handle.pid)
        if child is not None:
            code = child.poll()  # reaps our own children (no zombies)
            if code is None:
                return ReplicaStatus(ReplicaPhase.RUNNING)
            del self._children[handle.pid]
        elif _alive(handle):
            return ReplicaStatus(ReplicaPhase.RUNNING)
        record = self._exit_record(handle)
        if record is not None:
            return record
        if child is not None and child.returncode is not None:
            code = child.returncode
            if code < 0:
                return ReplicaStatus(
                    ReplicaPhase.EXITED, 128 - code, f"supervisor killed by signal {-code}"
                )
            return ReplicaStatus(ReplicaPhase.EXITED, code, "supervisor exited")
        return ReplicaStatus(ReplicaPhase.LOST, None, "process gone without an exit status")

    def stop(self, handle: ReplicaHandle, force: bool = False) -> None:
        if handle.pid not in self._children and not _alive(handle):
            return
        try:
            if force:
                os.killpg(handle.pid, signal.SIGKILL)  # the shim leads its own session
            else:
                os.kill(handle.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise ExecutorError(f"cannot signal replica pid {handle.pid}: {exc}") from exc

    def recover(self, run_dir: str, rank: int) -> ReplicaHandle | None:
        path = Path(run_dir) / f"rank{rank}.pid"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        ticks = data.get("start_ticks")
        return ReplicaHandle(
            int(data["pid"]), int(ticks) if ticks is not None else None, run_dir, rank
        )
