"""Running a version's gates from the controller: another process, a clean environment, a
timeout, and the job sandbox where the server has one.

A version's factory is tenant code, so the controller never imports it. The gate process
(:mod:`coadapt.registry.gates`) gets an environment built from the same allowlist as a job's
replicas (:func:`coadapt.controller.launch_plan.inherited`: no ``COADAPT_TOKEN``, no database
URL), an empty working directory of its own, its own session (the whole group is killed on
timeout), and, through ``confine``, the confinement the executor gives the tenant's jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from coadapt.controller.launch_plan import inherited
from coadapt.executors.sandbox import Isolation
from coadapt.registry.config import GateConfig

#: Wraps the gate's argv for a tenant (``argv, tenant name, work dir, what it must read ->
#: argv``): the server passes one that runs it in the job sandbox; None runs it as it is.
Confine = Callable[[Sequence[str], str, Path, Sequence[Path]], list[str]]

_PKG_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class GateOutcome:
    """What the gate process reported (or why it reported nothing)."""

    passed: bool
    reason: str | None
    checks: list[dict[str, Any]]


def gate_env(environ: Mapping[str, str], gates: GateConfig) -> dict[str, str]:
    """The gate process's whole environment: the replicas' allowlist, coadapt importable,
    one compute thread unless the controller says otherwise."""
    env = {k: v for k, v in environ.items() if inherited(k)}
    paths = [*gates.pythonpath, _PKG_ROOT, *filter(None, env.get("PYTHONPATH", "").split(":"))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def run_gates(
    root: str,
    version: str,
    live: str | None,
    gates: GateConfig,
    tenant: str,
    *,
    python: str = sys.executable,
    confine: Confine | None = None,
    environ: Mapping[str, str] | None = None,
) -> GateOutcome:
    """Run the gates of ``version`` in a child process and return its report."""
    request = {"root": root, "version": version, "live": live, "gates": gates.model_dump()}
    argv = [python, "-m", "coadapt.registry.gates", json.dumps(request)]
    env = gate_env(os.environ if environ is None else environ, gates)
    with tempfile.TemporaryDirectory(prefix="coadapt-gate-") as work:
        if confine is not None:
            reads = [Path(root), *(Path(p) for p in gates.pythonpath)]
            if gates.replay is not None:
                reads.append(Path(gates.replay).parent)
            argv = confine(argv, tenant, Path(work), reads)
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=gates.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return GateOutcome(
                False, f"the gates ran longer than timeout_s = {gates.timeout_s:g} s", []
            )
    return parse_report(proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def parse_report(code: int, out: str, err: str) -> GateOutcome:
    """The report the gate process printed last, or a failure naming its exit and stderr."""
    for line in reversed(out.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "passed" in data and "checks" in data:
            return GateOutcome(bool(data["passed"]), data.get("reason"), list(data["checks"]))
    tail = " | ".join(err.strip().splitlines()[-3:]) or "no output"
    return GateOutcome(False, f"the gate process exited with code {code}: {tail}", [])


def gate_confinement(isolation: Isolation | None) -> Confine | None:
    """Run gates as the tenant's jobs run: through the replica supervisor and the sandbox
    launcher (:mod:`coadapt.executors._shim`), with the state dir hidden and the tenant's
    run-as user; in ``namespace`` mode what the gate must read (the model root, the replay
    file's folder, ``pythonpath``) is bound back read-only where it would be out of reach.
    None where replicas are not confined."""
    if isolation is None or isolation.mode == "none":
        return None

    def confine(argv: Sequence[str], tenant: str, work: Path, reads: Sequence[Path]) -> list[str]:
        conf = isolation.confinement("gate", tenant, str(work))
        extra = tuple(str(p) for p in reads) if conf.namespace else ()
        conf = replace(conf, job_dir=str(work), expose=(*conf.expose, *extra))
        if conf.uid is not None and conf.gid is not None:
            os.chown(work, conf.uid, conf.gid)
        shim = [sys.executable, "-m", "coadapt.executors._shim", str(work), "0"]
        return [*shim, "--sandbox", conf.to_json(), "--", *argv]

    return confine
