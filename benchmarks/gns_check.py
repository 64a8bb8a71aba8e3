"""Is the library's gradient-noise estimate biased? Brute force on the tta_bench models (issue 19).

    python benchmarks/gns_check.py --json /tmp/gns.json              # all workloads (~1-2 min)
    python benchmarks/gns_check.py --workloads digits --steps 40,120

Each workload trains at its user batch M0 with the user's LR (one replica, the library's
``AdaptiveModel``, batch fixed). At each checkpoint step the weights are snapshotted and
four figures are taken from that same state:

* **brute force**: G = the full training set's gradient, tr Σ = b·E|g_b − G|² over ``draws``
  minibatches of b = M0 (finite-population corrected); with Adam both pre-conditioned by the
  library's P = diag(1 / (sqrt(v̂) + ε)). φ = tr Σ / |G|².
* **frozen**: the estimator the library uses at K > 1 and with accumulation
  (:func:`coadapt.train.gns.estimate`), two independent minibatches of M0 at these weights,
  averaged over ``repeats`` draws: unbiased by construction, a check of the algebra.
* **halves**: what one replica without accumulation measures now, a step of M0 split into
  two halves at these weights (:func:`coadapt.train.gns.halves_estimate`), ``repeats`` draws.
* **consecutive**: what it measured before (issue 19, round 4), three consecutive *optimizer
  steps* from this state (momentum, LR and all) fed to
  :func:`coadapt.train.gns.consecutive_estimate`, averaged over ``repeats`` restarts from the
  snapshot. The steps move the weights, and each step's noise moves the next step's gradient
  (G2 = G1 − η H ξ1 + ...), so E[g1·g2] picks up −η tr(HΣ)/b: the expectation is compared
  with brute force, which tells the bias apart from the estimator's variance.

Every estimate is a ratio of means over its draws (as the library's EMA takes it).

Output: a table and, with ``--json``, ``{"rows": [...], "summary": {...}}``; ratios are
estimate / brute force (1 = unbiased).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_common import load_average  # noqa: E402
from benchmarks.tta_bench import WORKLOADS, _builders  # noqa: E402


def _flat_grad(net: Any, params: list[Any]) -> Any:
    import torch

    return torch.cat([p.grad.reshape(-1) for p in params]).clone()


def _precond(opt: Any, params: list[Any]) -> Any | None:
    """The library's P⁻¹ = sqrt(v̂) + ε, flattened (None for optimisers without v̂)."""
    import torch

    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    beta2, eps = opt.param_groups[0]["betas"][1], float(opt.param_groups[0]["eps"])
    parts = []
    for p in params:
        st = opt.state.get(p)
        if not st or "exp_avg_sq" not in st:
            return None
        bc = 1.0 - beta2 ** max(float(st["step"]), 1.0)
        parts.append((st["exp_avg_sq"] / bc).sqrt().add(eps).reshape(-1))
    return torch.cat(parts)


def check_workload(
    name: str, at_steps: tuple[int, ...], draws: int, repeats: int
) -> list[dict[str, Any]]:
    """Rows of brute force vs the estimators at each step of ``at_steps`` (see module doc)."""
    import torch
    import torch.nn.functional as F

    import coadapt.train as ct
    from coadapt.train.gns import consecutive_estimate, estimate, halves_estimate

    w = WORKLOADS[name]
    train, _, _, make = _builders(name)
    torch.manual_seed(0)
    loader = ct.AdaptiveDataLoader(
        train, batch_size=w.init_batch, max_batch_size=w.init_batch, seed=0, name=f"gns-{name}"
    )
    net, opt = make(w.lr)
    model = ct.AdaptiveModel(
        net, opt, loader, name=f"gns-model-{name}", checkpoint_every=0, checkpoint_interval=0
    )
    x_all, y_all = train.tensors
    n, b = len(x_all), w.init_batch
    params = [p for p in net.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(1)

    def grad_of(idx: Any) -> Any:
        net.zero_grad()
        F.cross_entropy(net(x_all[idx]), y_all[idx]).backward()
        return _flat_grad(net, params)

    def batch() -> Any:
        return torch.randperm(n, generator=gen)[:b]

    out: list[dict[str, Any]] = []
    for _ in loader.epochs(10**6):
        for x, y in loader:
            if not (model.step(F.cross_entropy(model(x), y)) and model.steps in at_steps):
                continue
            started = time.perf_counter()
            net_state = copy.deepcopy(net.state_dict())
            opt_state = copy.deepcopy(opt.state_dict())
            pinv = _precond(opt, params)

            def pc(g: Any, p: Any = pinv) -> Any:
                return g if p is None else g / p

            full = pc(grad_of(torch.arange(n)))
            sqr_true = float(full.dot(full))
            dev = [float(((pc(grad_of(batch())) - full) ** 2).sum()) for _ in range(draws)]
            trace_true = b * statistics.fmean(dev) / (1 - b / n)
            frozen, halves = [], []
            for _ in range(repeats):
                g1, g2 = pc(grad_of(batch())), pc(grad_of(batch()))
                piece = 0.5 * (float(g1.dot(g1)) + float(g2.dot(g2)))
                mean = 0.5 * (g1 + g2)
                frozen.append(estimate(piece, float(mean.dot(mean)), b, 2))
                idx = batch()
                h1 = pc(grad_of(idx[: b // 2]))
                whole = pc(grad_of(idx))
                halves.append(
                    halves_estimate(
                        float(h1.dot(h1)),
                        float(h1.dot(whole)),
                        float(whole.dot(whole)),
                        b // 2,
                        b - b // 2,
                    )
                )
            moving = []
            for _ in range(repeats):  # three real optimizer steps from the snapshot
                net.load_state_dict(net_state)
                opt.load_state_dict(opt_state)
                rows = []
                for _ in range(3):
                    rows.append(grad_of(batch()))
                    opt.step()
                p_after = _precond(opt, params)  # the library takes P after the third step
                mat = torch.stack([g if p_after is None else g / p_after for g in rows])
                moving.append(consecutive_estimate((mat @ mat.t()).tolist(), b))
            net.load_state_dict(net_state)
            opt.load_state_dict(opt_state)
            net.zero_grad()
            f_sqr = statistics.fmean(s for s, _ in frozen)
            f_tr = statistics.fmean(t for _, t in frozen)
            m_sqr = statistics.fmean(s for s, _ in moving)
            m_tr = statistics.fmean(t for _, t in moving)
            h_sqr = statistics.fmean(s for s, _ in halves)
            h_tr = statistics.fmean(t for _, t in halves)
            out.append(
                {
                    "workload": name,
                    "step": model.steps,
                    "sqr_brute": sqr_true,
                    "trace_brute": trace_true,
                    "pgns_brute": trace_true / sqr_true,
                    "sqr_frozen": f_sqr,
                    "trace_frozen": f_tr,
                    "pgns_frozen": f_tr / f_sqr if f_sqr > 0 else float("inf"),
                    "sqr_halves": h_sqr,
                    "trace_halves": h_tr,
                    "pgns_halves": h_tr / h_sqr if h_sqr > 0 else float("inf"),
                    "sqr_consecutive": m_sqr,
                    "trace_consecutive": m_tr,
                    "pgns_consecutive": m_tr / m_sqr if m_sqr > 0 else float("inf"),
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )
            if model.steps >= max(at_steps):
                return out
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", default="digits,cancer,teacher,teacher-long")
    p.add_argument("--steps", default="40,120,240", help="checkpoint steps (at M0)")
    p.add_argument("--draws", type=int, default=200, help="minibatches for brute-force tr Σ")
    p.add_argument("--repeats", type=int, default=200, help="draws per estimator expectation")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    names = args.workloads.split(",")
    for name in names:
        if name not in WORKLOADS:
            p.error(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    try:
        at_steps = tuple(sorted(int(s) for s in args.steps.split(",")))
    except ValueError:
        p.error(f"--steps must be comma-separated integers, got {args.steps!r}")
    if not at_steps or at_steps[0] < 1 or args.draws < 2 or args.repeats < 1:
        p.error("need steps >= 1, --draws >= 2 and --repeats >= 1")

    import torch

    import coadapt.train as ct

    torch.set_num_threads(1)
    os.environ.setdefault("COADAPT_CHECKPOINT_DIR", tempfile.mkdtemp(prefix="coadapt-gns-"))
    ct.init()
    load = load_average()
    rows = [r for name in names for r in check_workload(name, at_steps, args.draws, args.repeats)]
    ct.shutdown()
    head = (
        f"{'workload':<13}{'step':>5}{'φ brute':>9}{'frozen':>8}{'halves':>8}{'consec':>8}"
        f"{'|G|² consec':>12}{'trΣ consec':>11}"
    )
    print(head + "   (estimate / brute force; consec = three consecutive steps)")
    for r in rows:
        print(
            f"{r['workload']:<13}{r['step']:>5}{r['pgns_brute']:>9.1f}"
            f"{r['pgns_frozen'] / r['pgns_brute']:>8.2f}"
            f"{r['pgns_halves'] / r['pgns_brute']:>8.2f}"
            f"{r['pgns_consecutive'] / r['pgns_brute']:>8.2f}"
            f"{r['sqr_consecutive'] / r['sqr_brute']:>12.2f}"
            f"{r['trace_consecutive'] / r['trace_brute']:>11.2f}"
        )
    summary = {
        "load_before": load,
        "load_after": load_average(),
        "command": " ".join(["python", "benchmarks/gns_check.py", *(argv or sys.argv[1:])]),
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
