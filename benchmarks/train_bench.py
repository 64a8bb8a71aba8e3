"""Benchmark of coadapt.train: overhead, rescale latency, PGNS accuracy, time to accuracy.

    python benchmarks/train_bench.py --json /tmp/train.json

* overhead_1r / overhead_2r: median optimizer-step time of examples/digits_cnn.py (batch pinned
  at 64, noise measurement on) over its plain-PyTorch DDP twin, 1 and 2 replicas.
* rescale_s: SIGTERM to a 1-replica run-local job → first optimizer step of the restarted
  2-replica job (checkpoint, exit, process start, torch import, rendezvous, restore).
* pgns_rel_err: |φ̂ − φ| / φ on y = x·w* + ε at fixed w, where φ = (d + 1) + dσ²/|δ|² exactly;
  the worst of the three estimators (micro-batches, consecutive steps, 2 replicas).
* tta_adaptive_s / tta_fixed_s: training seconds to a test accuracy at 2 replicas.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "examples" / "digits_cnn.py"
PLAIN = ROOT / "examples" / "plain" / "digits_cnn.py"
PGNS_SCRIPT = ROOT / "examples" / "pgns_linear.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONPATH"] = str(ROOT)
    return env


def run_local(replicas: int, script: Path, args: list[str], ckpt: Path | None = None,
              timeout: float = 300) -> str:
    if ckpt is None:  # a fresh directory: no stale checkpoint, metrics not in the cwd
        ckpt = Path(tempfile.mkdtemp(prefix="coadapt-bench-"))
    cmd = [sys.executable, "-m", "coadapt.train.launch", "-n", str(replicas),
           "--checkpoint-dir", str(ckpt)]
    proc = subprocess.run([*cmd, str(script), *args], cwd=ROOT, env=_env(), timeout=timeout,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
    return proc.stdout


def step_time(replicas: int, script: Path, tmp: Path, steps: int) -> float:
    out = tmp / f"timing-{script.parent.name}-{replicas}.json"
    args = ["--batch-size", "64", "--max-steps", str(steps), "--epochs", "1000",
            "--timing-file", str(out)]
    if script == LIB:
        args.append("--fixed")
    run_local(replicas, script, args, ckpt=tmp / f"ck-{time.monotonic_ns()}")
    return float(statistics.median(json.loads(out.read_text())["step_times"]))


def overhead(replicas: int, tmp: Path, steps: int, repeats: int) -> tuple[float, float, float]:
    lib, plain = [], []
    for _ in range(repeats):  # interleaved, so drifting machine load hits both alike
        plain.append(step_time(replicas, PLAIN, tmp, steps))
        lib.append(step_time(replicas, LIB, tmp, steps))
    p, m = statistics.median(plain), statistics.median(lib)
    return m / p, m, p


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def rescale(tmp: Path) -> float:
    ck = tmp / "ck-rescale"
    metrics = ck / "metrics.jsonl"
    cmd = [sys.executable, "-m", "coadapt.train.launch", "-n", "1", "--checkpoint-dir",
           str(ck), str(LIB), "--epochs", "100000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                r.get("kind") == "progress" and r.get("step", 0) >= 60
                for r in _records(metrics)):
            time.sleep(0.1)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    cmd[4] = "2"
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        first = None
        while time.monotonic() < deadline and first is None:
            first = next((r for r in _records(metrics) if r.get("kind") == "first_step"
                          and r.get("replicas") == 2), None)
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    if first is None:
        raise RuntimeError("the restarted job never stepped")
    return float(first["time"]) - t0


def pgns_errors(tmp: Path) -> dict[str, float]:
    out = tmp / "pgns.json"
    errs: dict[str, float] = {}
    for name, args, reps in [("micro_batches", ["--accum", "3"], 1),
                             ("consecutive", ["--accum", "0"], 1),
                             ("replicas", ["--accum", "0"], 2)]:
        run_local(reps, PGNS_SCRIPT, [*args, "--out", str(out)])
        res = json.loads(out.read_text())
        errs[name] = abs(res["estimate"] - res["truth"]) / res["truth"]
    return errs


def tta(adaptive: bool, target: float) -> float:
    args = ["--epochs", "200", "--target-accuracy", str(target)]
    if not adaptive:
        args.append("--fixed")
    out = run_local(2, LIB, args)
    match = re.search(r"TARGET \S+ reached at ([0-9.]+)s", out)
    if match is None:
        raise RuntimeError(f"target accuracy not reached:\n{out[-2000:]}")
    return float(match.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--steps", type=int, default=200, help="steps per overhead run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target-accuracy", type=float, default=0.97)
    args = p.parse_args()
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for k in (1, 2):
            ratio, lib, plain = overhead(k, tmp, args.steps, args.repeats)
            res[f"overhead_{k}r"] = ratio
            res[f"step_ms_{k}r"] = {"library": lib * 1e3, "plain": plain * 1e3}
        res["rescale_s"] = rescale(tmp)
        errs = pgns_errors(tmp)
        res["pgns_rel_err"] = max(errs.values())
        res["pgns_rel_err_by_estimator"] = errs
        res["tta_target"] = args.target_accuracy
        res["tta_adaptive_s"] = tta(True, args.target_accuracy)
        res["tta_fixed_s"] = tta(False, args.target_accuracy)
    goals = {"overhead_1r": 1.03, "overhead_2r": 1.03, "rescale_s": 5.0, "pgns_rel_err": 0.15}
    print(f"{'metric':<18}{'value':>10}  goal")
    for key in ("overhead_1r", "overhead_2r", "rescale_s", "pgns_rel_err", "tta_adaptive_s",
                "tta_fixed_s"):
        goal = goals.get(key)
        mark = "" if goal is None else f"<= {goal}  {'ok' if res[key] <= goal else 'MISSED'}"
        print(f"{key:<18}{res[key]:>10.3f}  {mark}")
    print("step ms:", res["step_ms_1r"], res["step_ms_2r"])
    print("pgns error by estimator:", errs)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
