"""Replica confinement: what a tenant's training process can see and who it runs as.

Without it a replica runs as the controller's user and can read the admin token and the
database (which holds every job's metrics secret). The shim (:mod:`coadapt.executors._shim`)
runs each replica through this module's launcher
(``python -m coadapt.executors.sandbox CONFIG -- ARGV``), which, before ``exec``:

* ``namespace`` mode: the shim has put the launcher in a fresh PID namespace (it is init
  there, so the replica sees and can signal only its own processes, and its stray children
  die with it); the launcher makes a private mount namespace where the state dir (and the
  shared job root) is covered by an empty read-only tmpfs and only this job's directory is
  bound back at its usual path; what the replica must run (the interpreter's prefix, the
  venv, coadapt itself) is bound back read-only where an ancestor the run-as user cannot
  traverse (e.g. root's 0700 home holding pyenv) would block it; mounts a fresh ``/proc``,
  then drops to the run-as user. As
  non-root the same is done inside user namespaces (the replica keeps the controller's uid
  but sees none of its files), with a nested user namespace so the replica cannot unmount
  the cover;
* ``user`` mode: only drops to the run-as user (file modes do the rest; weaker);
* every mode: joins the replica's memory cgroup or sets RLIMIT_AS
  (:mod:`coadapt.executors.memlimit`), clears supplementary groups, sets no-new-privileges.
"""

from __future__ import annotations

import contextlib
import ctypes
import grp
import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from coadapt.executors import memlimit
from coadapt.executors.memlimit import MemoryLimit

MODES = ("auto", "namespace", "user", "none")
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
SETUP_FAILED = 126  # exit code of a replica whose confinement could not be set up
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class SandboxError(RuntimeError):
    """Confinement is unavailable or was configured wrongly; the message names the fix."""


@dataclass(frozen=True)
class RunAs:
    """The unprivileged identity replicas run as."""

    uid: int
    gid: int
    label: str


def parse_run_as(text: str, flag: str = "--run-as") -> RunAs:
    """``USER[:GROUP]`` by name or number; the group defaults to the user's primary group."""
    user, _, group = text.partition(":")
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid = pw.pw_uid, pw.pw_gid
    except KeyError:
        if not user.isdigit():
            raise SandboxError(
                f"{flag}: no user {user!r} on this machine; create it (useradd --system "
                f"{user}) or give a numeric UID[:GID]"
            ) from None
        uid = gid = int(user)
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise SandboxError(f"{flag}: no group {group!r} on this machine") from None
    if uid == 0:
        raise SandboxError(f"{flag}: {text!r} is root; replicas must run unprivileged")
    return RunAs(uid, gid, text)


@dataclass(frozen=True)
class Confinement:
    """One replica's confinement; crosses from executor to shim to launcher as JSON."""

    namespace: bool = False
    rootless: bool = False  # namespaces via user namespaces (the controller is not root)
    hide: tuple[str, ...] = ()  # covered in the replica's view (state dir, shared job root)
    job_dir: str | None = None  # bound back inside the covered tree
    # Read-only trees the replica must reach (interpreter, venv, coadapt): bound back at their
    # paths when an ancestor the run-as user cannot traverse would hide them.
    expose: tuple[str, ...] = ()
    cwd: str = "."
    uid: int | None = None  # drop to this uid/gid (root controller only)
    gid: int | None = None
    memory: MemoryLimit | None = None
    cgroup: str | None = None  # the replica's cgroup (made by the shim)
    outer_uid: int | None = None  # the controller's ids, recorded by the shim (rootless)
    outer_gid: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Confinement:
        data: dict[str, Any] = json.loads(text)
        mem = data.pop("memory", None)
        data["hide"] = tuple(data.get("hide", ()))
        data["expose"] = tuple(data.get("expose", ()))
        return cls(**data, memory=MemoryLimit(**mem) if mem else None)


@dataclass(frozen=True)
class Isolation:
    """The executor's confinement policy (``coadapt server --isolation/--run-as/...``)."""

    mode: str = "none"  # resolved: namespace | user | none
    rootless: bool = False
    run_as: RunAs | None = None
    tenant_run_as: Mapping[str, RunAs] = field(default_factory=dict)
    hide: tuple[str, ...] = ()
    expose: tuple[str, ...] = ()  # see Confinement.expose
    jobs_root: str | None = None
    memory: MemoryLimit | None = None  # per slot (each replica holds one slot)
    note: str = ""  # why ``auto`` settled for less than namespaces

    @property
    def active(self) -> bool:
        return self.mode != "none" or self.memory is not None

    def identity(self, tenant: str | None) -> RunAs | None:
        if self.mode == "none" or self.rootless:
            return None
        return self.tenant_run_as.get(tenant or "", self.run_as)

    def confinement(self, job_id: str, tenant: str | None, cwd: str) -> Confinement:
        who = self.identity(tenant)
        job_dir = str(Path(self.jobs_root) / job_id) if self.jobs_root else None
        return Confinement(
            namespace=self.mode == "namespace",
            rootless=self.rootless,
            hide=self.hide if self.mode == "namespace" else (),
            job_dir=job_dir,
            expose=self.expose if self.mode == "namespace" else (),
            cwd=cwd,
            uid=who.uid if who else None,
            gid=who.gid if who else None,
            memory=self.memory,
        )

    def describe(self) -> dict[str, Any]:
        """What is in force (printed at server start, shown in /api/v1/cluster)."""
        who = None if self.mode in ("none",) or self.rootless else self.run_as
        return {
            "mode": self.mode + (" (rootless)" if self.rootless and self.mode != "none" else ""),
            "run_as": who.label if who else None,
            "tenant_run_as": {t: r.label for t, r in self.tenant_run_as.items()},
            "memory_per_slot": self.memory.limit_bytes if self.memory else None,
            "memory_mechanism": self.memory.mechanism if self.memory else None,
            "note": self.note,
        }


# -- system calls ------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    enc = [s.encode() if s is not None else None for s in (src, target, fstype, data)]
    rc = _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])
    _check(rc, f"mount {fstype or 'bind'} on {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _map_ids(inner_uid: int, outer_uid: int, inner_gid: int, outer_gid: int) -> None:
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{inner_uid} {outer_uid} 1")
    Path("/proc/self/gid_map").write_text(f"{inner_gid} {outer_gid} 1")


def enter_pid_namespace(conf: Confinement) -> None:
    """Called by the shim before it starts the launcher: the launcher becomes init of a new
    PID namespace (inside a new user namespace where the controller is not root)."""
    if not conf.namespace:
        return
    if conf.rootless:
        _unshare(_CLONE_NEWUSER | _CLONE_NEWPID)
        _map_ids(0, os.getuid() if conf.outer_uid is None else conf.outer_uid, 0, os.getgid())
    else:
        _unshare(_CLONE_NEWPID)


# -- the launcher (runs as the controller's user until it drops) -------------------------
def _traversable(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXGRP if st.st_gid == gid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def _cover_point(hidden: Path, conf: Confinement) -> Path:
    """Where to put the cover: ``hidden`` itself, or its topmost ancestor the run-as user
    cannot traverse (covering that hides nothing the user could have reached, and lets the
    bound-back job dir be reached at its usual path)."""
    if conf.uid is None or conf.gid is None:
        return hidden
    for anc in [*reversed(hidden.parents), hidden]:
        if not _traversable(anc, conf.uid, conf.gid):
            return anc
    return hidden


def _blocker(path: Path, conf: Confinement) -> Path | None:
    """The topmost strict ancestor of ``path`` the run-as user cannot traverse, if any."""
    if conf.uid is None or conf.gid is None:
        return None
    for anc in reversed(path.parents):
        if not _traversable(anc, conf.uid, conf.gid):
            return anc
    return None


def _private_mounts(conf: Confinement) -> None:
    """Cover the hidden trees, bind this job's directory back, and make the interpreter
    reachable (mount namespace only)."""
    _unshare(_CLONE_NEWNS)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    job_fd = os.open(conf.job_dir, os.O_PATH | os.O_DIRECTORY) if conf.job_dir else None
    # Opened before anything is covered: the covers may hide the paths themselves.
    exposed: list[tuple[Path, int, Path]] = []
    for name in conf.expose:
        path = Path(name)
        blocker = _blocker(path, conf) if path.is_dir() else None
        if blocker is not None:
            exposed.append((path, os.open(path, os.O_PATH | os.O_DIRECTORY), blocker))
    covered: list[Path] = []
    for hidden in sorted((Path(h) for h in conf.hide), key=lambda p: len(p.parts)):
        if any(c == hidden or c in hidden.parents for c in covered) or not hidden.exists():
            continue
        point = _cover_point(hidden, conf)
        _mount("coadapt-hidden", str(point), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
        covered.append(point)
    if job_fd is not None and conf.job_dir is not None:
        target = Path(conf.job_dir)
        if any(c == target or c in target.parents for c in covered):
            target.mkdir(parents=True, exist_ok=True)
            _mount(f"/proc/self/fd/{job_fd}", str(target), None, _MS_BIND | _MS_REC, None)
        os.close(job_fd)
    for path, fd, blocker in exposed:
        if not any(c == blocker or c in blocker.parents for c in covered):
            _mount("coadapt-hidden", str(blocker), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
            covered.append(blocker)
        path.mkdir(parents=True, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", str(path), None, _MS_BIND | _MS_REC, None)
        ro = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        _mount(None, str(path), None, ro, None)
        os.close(fd)
    for point in covered:  # the cover itself is read-only: nothing to plant for a later job
        flags = _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        _mount(None, str(point), None, flags, None)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


def _drop(conf: Confinement) -> None:
    """Memory limit, identity, no new privileges, working dir: the last steps before exec."""
    if conf.cgroup is not None:
        memlimit.join(Path(conf.cgroup))
    elif conf.memory is not None and conf.memory.mechanism == memlimit.RLIMIT:
        memlimit.apply_rlimit(conf.memory.limit_bytes)
    if conf.namespace and conf.rootless and conf.outer_uid is not None:
        # Nested user namespace: the mounts above become locked (cannot be unmounted), and
        # the replica runs as the controller's uid there, i.e. with no capabilities at all.
        _unshare(_CLONE_NEWUSER | _CLONE_NEWNS)
        _map_ids(conf.outer_uid, 0, conf.outer_gid or 0, 0)
    elif conf.uid is not None and conf.gid is not None:
        os.setgroups([])
        os.setresgid(conf.gid, conf.gid, conf.gid)
        os.setresuid(conf.uid, conf.uid, conf.uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))  # cleared by the uid change: set again
    try:
        os.chdir(conf.cwd)
    except OSError as exc:
        who = f"uid {conf.uid}" if conf.uid is not None else "the replica"
        raise SandboxError(
            f"working dir {conf.cwd!r} is not reachable by {who} inside the sandbox ({exc}); "
            "use a working_dir outside the controller's state dir that the run-as user can "
            "read, or the default (the job's own directory)"
        ) from exc


def _init(child: int) -> int:
    """PID 1 of the replica's namespace: forward signals, reap, report the child's status."""

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # shell convention for a signal


def _fail(exc: BaseException) -> int:
    print(f"coadapt: cannot confine the replica: {exc}", file=sys.stderr, flush=True)
    return SETUP_FAILED


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m coadapt.executors.sandbox CONFIG -- ARGV...", file=sys.stderr)
        return 2
    conf, cmd = Confinement.from_json(argv[0]), argv[2:]
    try:
        if conf.namespace:
            _private_mounts(conf)
    except (OSError, SandboxError) as exc:
        return _fail(exc)
    child = os.fork() if conf.namespace else 0
    if child:
        return _init(child)
    try:
        _drop(conf)
    except (OSError, SandboxError) as exc:
        code = _fail(exc)
        if conf.namespace:
            os._exit(code)
        return code
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        why: BaseException = exc
        if conf.uid is not None:
            why = SandboxError(
                f"uid {conf.uid} cannot execute {cmd[0]!r} ({exc.strerror}): install the "
                "interpreter and the job's code where the run-as user can read them (not "
                "under root's home), or choose another --run-as user"
            )
        code = _fail(why)
        if conf.namespace:
            os._exit(code)
        return code
    return 0  # not reached: exec replaced us


# -- availability ------------------------------------------------------------------------
_PROBE = """
import os, sys
secret, job, namespace = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
ok = os.access(".", os.W_OK) and not os.access(secret, os.R_OK)
if namespace:
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    ok = ok and not os.path.exists(secret) and len(pids) < 8
    ok = ok and os.listdir(os.path.dirname(job)) == ["probe"] and os.getuid() != 0
sys.exit(0 if ok else 3)
"""


def probe(conf: Confinement, python: str | None = None, timeout: float = 20.0) -> str | None:
    """Run a throw-away replica under ``conf`` through the real shim; None if it was
    confined as asked, else why not (the reason becomes part of an error message)."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory(prefix="coadapt-probe-") as tmp:
        state = Path(tmp) / "state"
        job = state / "jobs" / "probe"
        job.mkdir(parents=True)
        (state / "secret").write_text("x")
        (state / "secret").chmod(0o600)
        if conf.uid is not None and conf.gid is not None:
            os.chown(job, conf.uid, conf.gid)
        conf = replace(
            conf, hide=(str(state),) if conf.namespace else (), job_dir=str(job), cwd=str(job)
        )
        if not conf.namespace:
            for d in (Path(tmp), state, state / "jobs"):
                d.chmod(0o711)
        check = [python or sys.executable, "-c", _PROBE, str(state / "secret"), str(job)]
        check.append("1" if conf.namespace else "0")
        argv = [sys.executable, "-m", "coadapt.executors._shim", str(tmp), "0"]
        argv += ["--sandbox", conf.to_json(), "--", *check]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": pkg_root}
        try:
            out = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if out.returncode == 0:
            return None
        if out.returncode == 3:
            return "the probe replica could still see what it should not"
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return last.removeprefix("coadapt: cannot confine the replica: ")


def interpreter_trees(python: str | None = None) -> tuple[str, ...]:
    """What a replica needs to read to run ``python -m coadapt...`` and a ``python`` job:
    the real interpreter's prefix, this process's venv and base prefix, and coadapt."""
    exe = Path(python or sys.executable).resolve()
    trees = {exe.parent.parent, Path(sys.prefix), Path(sys.base_prefix)}
    trees.add(Path(__file__).resolve().parents[2])
    return tuple(sorted(str(t) for t in trees))


def resolve(
    mode: str,
    *,
    run_as: str | None = None,
    tenant_run_as: Mapping[str, str] | None = None,
    hide: tuple[str, ...] = (),
    jobs_root: str | None = None,
    memory: MemoryLimit | None = None,
    python: str | None = None,
) -> Isolation:
    """The strongest confinement ``mode`` allows here (``auto``: namespace, else user,
    else none); :class:`SandboxError` names the fix when an explicit mode cannot be had.
    The probe runs ``python`` (default: ours, which ``python`` jobs run) confined."""
    if mode not in MODES:
        raise SandboxError(f"--isolation: unknown mode {mode!r}; accepted: {', '.join(MODES)}")
    root = os.geteuid() == 0
    if not root and (run_as or tenant_run_as):
        raise SandboxError(
            "--run-as/--run-as-tenant need a controller running as root (this one runs as "
            f"uid {os.geteuid()}); without root, --isolation namespace keeps the controller's "
            "uid and hides its files with user namespaces"
        )
    who = parse_run_as(run_as or "nobody") if root else None
    per_tenant = {t: parse_run_as(u, "--run-as-tenant") for t, u in (tenant_run_as or {}).items()}
    base = Isolation(
        mode="none",
        rootless=not root,
        run_as=who,
        tenant_run_as=per_tenant,
        hide=hide,
        expose=interpreter_trees(python) if root else (),
        jobs_root=jobs_root,
        memory=memory,
    )
    if mode == "none":
        return base
    if mode in ("auto", "namespace"):
        ns = replace(base, mode="namespace")
        why = probe(ns.confinement("probe", None, "."), python)
        if why is None:
            return ns
        if mode == "namespace":
            raise SandboxError(
                f"--isolation namespace is unavailable here: {why}; enable (unprivileged) "
                "user namespaces or run as root, or choose --isolation user (root) or "
                "--isolation none to accept the risk explicitly"
            )
        base = replace(base, note=f"namespaces unavailable: {why}")
    if root:
        user = replace(base, mode="user")
        why = probe(user.confinement("probe", None, "."), python)
        if why is None:
            return user
        if mode == "user":
            raise SandboxError(f"--isolation user is unavailable here: {why}")
        return replace(base, note=f"{base.note}; run-as user unusable: {why}".lstrip("; "))
    if mode == "user":
        raise SandboxError(
            f"--isolation user needs a controller running as root (this one runs as uid "
            f"{os.geteuid()}); use --isolation namespace, or --isolation none to accept the risk"
        )
    return base


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
