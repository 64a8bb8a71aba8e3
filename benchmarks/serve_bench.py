"""Dense-model serving throughput: coadapt.serve against Ray Serve, LitServe and TorchServe.

The same CPU MLP (``coadapt.serve.models.MLP``: 64 -> 256 -> 256 -> 8, seeded), the same cores,
the same one-row JSON request, 32 concurrent keep-alive clients driven by ``wrk`` (C, so the
load generator takes little of the shared cores), each measurement bounded in time
(``--duration``) after a warm-up. Every system runs alone while measured (started, warmed,
measured, stopped), and the systems are interleaved in ``--rounds`` rounds with the order
rotated, so a busy neighbour on this shared machine hits all of them alike; the load average
is recorded beside every row. The whole run happens in a loopback-only network namespace
(``unshare -n``), which Ray needs (it rewrites 127.0.0.1 otherwise).

    python benchmarks/serve_bench.py --install          # wrk, Java, and the peers' venv
    python benchmarks/serve_bench.py --json out/serve.json [--rounds 2] [--duration 10]

Rows (``--json``): ``name`` (``dense-mlp-json`` / ``dense-mlp-binary``), ``peer`` (null for
coadapt; ``ray-serve``, ``litserve``, ``torchserve``), ``rps``, ``p50_ms``, ``p99_ms``,
``errors`` (socket errors + non-2xx), ``slo_met`` (p99 <= 50 ms), ``round``, ``load_avg``;
``dense-mlp-json-hotswap`` is coadapt while a new version (full and incremental in turn) is
published and activated every 0.5 s, with ``swaps`` the number activated;
then one summary row per system (``round`` null: the median over rounds) with ``x_ray``/``x_ts``
ratios. ``--ctr`` adds the sparse CTR rows (``ctr-...``: 200 x 500 latency and the QPS at which
p99 <= 10 ms holds, full / 1 % incremental version publish + gate + load, p99 during a live
delta, memory per row, train-to-serve freshness; ``benchmarks/serve/ctr.py``, sized by
``--ctr-rows``), then the same model served from ``--ctr-table-shards N`` table-shard processes
in the same run (``ctr-sharded<N>-...``: RSS per process vs the unsharded worker, latency per
rate, p99 during a live delta; ``--ctr-table-shards 0`` skips them); ``--ctr-only`` runs just
those (no wrk, no peers).
Peers run from a separate virtual environment (``--peers-venv``) holding the
``bench-serve`` extra (torch, ray[serve], litserve, torchserve), never in coadapt's own; each
peer gets the same two cores' worth of workers (2 replicas / workers, 1 torch thread each),
batching up to 32 rows with a 2 ms wait.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coadapt.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
MLP_KW = {"seed": 0, "in_features": 64, "hidden": 256, "out_features": 8, "depth": 2}
DEFAULT_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "coadapt/serve-peers"
)
SLO_MS = 50.0
BODY = json.dumps({"instances": [[0.25] * MLP_KW["in_features"]]})


# ----------------------------------------------------------------------------- install


def install(venv: Path) -> int:
    """wrk and a JRE from Debian; the peers (bench-serve extra) into their own venv."""
    missing = [p for p, exe in (("wrk", "wrk"), ("openjdk-17-jre-headless", "java"))
               if shutil.which(exe) is None]  # fmt: skip
    if missing:
        subprocess.run(["apt-get", "install", "-y", *missing], check=True)
    if not (venv / "bin/python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"{ROOT}[bench-serve]"], check=True)
    return 0


# ----------------------------------------------------------------------------- peers' code

LITSERVE_APP = """
import json, sys, torch, litserve as ls
from coadapt.serve.models import make_mlp
KW = json.loads(sys.argv[2])

class API(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        self.model = make_mlp(**KW).eval()
    def decode_request(self, request):
        return request["instances"][0]
    def batch(self, inputs):
        return torch.tensor(inputs, dtype=torch.float32)
    def predict(self, x):
        with torch.inference_mode():
            return self.model(x)
    def unbatch(self, output):
        return output.tolist()
    def encode_response(self, output):
        return {"predictions": [output]}

if __name__ == "__main__":
    api = API(max_batch_size=32, batch_timeout=0.002, api_path="/predict")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=2)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), num_api_servers=1,
               generate_client_file=False, log_level="warning")
"""

RAY_APP = """
import json, sys, time, torch, ray
from ray import serve
from coadapt.serve.models import make_mlp
KW = json.loads(sys.argv[2])
ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64,
                  logging_config={"enable_access_log": False, "log_level": "WARNING"})
class MLPServe:
    def __init__(self):
        torch.set_num_threads(1)
        self.model = make_mlp(**KW).eval()
    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def forward(self, rows):
        with torch.inference_mode():
            return self.model(torch.tensor(rows, dtype=torch.float32)).tolist()
    async def __call__(self, request):
        doc = await request.json()
        return {"predictions": [await self.forward(doc["instances"][0])]}

serve.run(MLPServe.bind(), route_prefix="/predict")
print("READY", flush=True)
while True:
    time.sleep(1)
"""

TS_HANDLER = """
import json, torch
from ts.torch_handler.base_handler import BaseHandler
from mlp_models import make_mlp
KW = %s

class Handler(BaseHandler):
    def initialize(self, context):
        torch.set_num_threads(1)
        self.model = make_mlp(**KW).eval()
        self.initialized = True
    def handle(self, data, context):
        rows = []
        for d in data:
            body = d.get("body") or d.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            rows.append(body["instances"][0])
        with torch.inference_mode():
            out = self.model(torch.tensor(rows, dtype=torch.float32)).tolist()
        return [{"predictions": [o]} for o in out]
"""


TS_LOG4J = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="STDOUT" target="SYSTEM_OUT">
    <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="STDOUT"/></Root></Loggers>
</Configuration>
"""


# ----------------------------------------------------------------------------- servers


@dataclass
class Running:
    """A server under test: its process group, URL, content type and body."""

    proc: subprocess.Popen[bytes]
    url: str
    content_type: str = "application/json"
    body: bytes = BODY.encode()
    stop_extra: Callable[[], None] | None = None
    models: Path | None = None  # coadapt's version directory


def swap_versions(r: Running, stop_event: threading.Event, period_s: float = 0.5) -> int:
    """Publish and activate a new version every ``period_s`` (full and incremental in turn)
    while the load runs; how many were activated."""
    import torch

    from coadapt.serve import artifacts
    from coadapt.serve.models import make_mlp

    if r.models is None:
        raise RuntimeError("swaps need a coadapt server")
    model = make_mlp(**MLP_KW)
    n = 0
    while not stop_event.wait(period_s):
        with torch.no_grad():
            model[4].bias.add_(0.01)  # the last layer's bias: the delta is one small tensor
        m = artifacts.publish(model, r.models, factory="coadapt.serve.models:make_mlp",
                              factory_kwargs=MLP_KW, incremental=n % 2 == 1)  # fmt: skip
        artifacts.set_live(r.models, m.version)
        n += 1
    return n


def _env(extra_path: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), extra_path) if p)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _post_ok(r: Running) -> bool:
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(r.url)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        c.request("POST", u.path, r.body, {"Content-Type": r.content_type})
        ok = c.getresponse().status == 200
        c.close()
        return ok
    except OSError:
        return False


def wait_ready(r: Running, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if r.proc.poll() is not None:
            raise RuntimeError(f"server exited with {r.proc.returncode}")
        if _post_ok(r):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{r.url} not answering after {timeout:.0f} s")


def stop(r: Running) -> None:
    """SIGTERM the server's process group (it was started in its own), then SIGKILL."""
    if r.stop_extra is not None:
        r.stop_extra()
    if r.proc.poll() is None:
        os.killpg(r.proc.pid, signal.SIGTERM)
        try:
            r.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()


def _popen(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 (kept open for the server's life)
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def start_coadapt(work: Path, binary: bool, store: str = "mlp") -> Running:
    models = work / "coadapt-models" / store
    if not models.exists():
        from coadapt.serve import artifacts
        from coadapt.serve.models import make_mlp

        artifacts.publish(make_mlp(**MLP_KW), models, factory="coadapt.serve.models:make_mlp",
                          factory_kwargs=MLP_KW)  # fmt: skip
    port = free_port()
    cmd = [sys.executable, "-m", "coadapt.serve", "--model", f"mlp={models}", "--port", str(port)]
    proc = _popen(cmd, _env(), ROOT, work / "coadapt.log")
    r = Running(proc, f"http://127.0.0.1:{port}/v1/models/mlp:predict")
    r.models = models
    if binary:
        import numpy as np

        from coadapt.serve import codec

        row = np.full((1, MLP_KW["in_features"]), 0.25, dtype=np.float32)
        r.content_type, r.body = codec.BINARY, codec.encode_arrays([row])
    return r


def start_litserve(work: Path, venv: Path) -> Running:
    app = work / "lit_app.py"
    app.write_text(LITSERVE_APP)
    port = free_port()
    cmd = [str(venv / "bin/python"), str(app), str(port), json.dumps(MLP_KW)]
    proc = _popen(cmd, _env(), work, work / "litserve.log")
    return Running(proc, f"http://127.0.0.1:{port}/predict")


def start_ray(work: Path, venv: Path) -> Running:
    app = work / "ray_app.py"
    app.write_text(RAY_APP)
    port = free_port()
    cmd = [str(venv / "bin/python"), str(app), str(port), json.dumps(MLP_KW)]
    env = _env()
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    proc = _popen(cmd, env, work, work / "ray.log")
    return Running(proc, f"http://127.0.0.1:{port}/predict")


def start_torchserve(work: Path, venv: Path) -> Running:
    ts = work / "torchserve"
    store = ts / "store"
    store.mkdir(parents=True, exist_ok=True)
    (ts / "handler.py").write_text(TS_HANDLER % json.dumps(MLP_KW))
    shutil.copy(ROOT / "coadapt/serve/models.py", ts / "mlp_models.py")
    if not (store / "mlp.mar").exists():
        subprocess.run(
            [str(venv / "bin/torch-model-archiver"), "--model-name", "mlp", "--version", "1.0",
             "--handler", str(ts / "handler.py"), "--extra-files", str(ts / "mlp_models.py"),
             "--export-path", str(store), "-f"],
            check=True, cwd=ts,
        )  # fmt: skip
    (ts / "log4j2.xml").write_text(TS_LOG4J)  # warnings only: no line per request
    port, mport, xport = free_port(), free_port(), free_port()
    models = {"mlp": {"1.0": {"defaultVersion": True, "marName": "mlp.mar", "minWorkers": 2,
                              "maxWorkers": 2, "batchSize": 32, "maxBatchDelay": 2,
                              "responseTimeout": 120}}}  # fmt: skip
    (ts / "config.properties").write_text(textwrap.dedent(f"""\
        inference_address=http://127.0.0.1:{port}
        management_address=http://127.0.0.1:{mport}
        metrics_address=http://127.0.0.1:{xport}
        model_store={store}
        load_models=mlp.mar
        default_workers_per_model=2
        disable_token_authorization=true
        job_queue_size=1000
        async_logging=true
        vmargs=-Dlog4j.configurationFile=file://{ts / "log4j2.xml"}
        models={json.dumps(models)}
        """))  # fmt: skip
    env = _env()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env["TS_DISABLE_SYSTEM_METRICS"] = "true"
    cmd = [str(venv / "bin/torchserve"), "--start", "--foreground", "--ncs",
           "--model-store", str(store), "--ts-config", str(ts / "config.properties"),
           "--disable-token-auth"]  # fmt: skip
    proc = _popen(cmd, env, ts, work / "torchserve.log")
    return Running(proc, f"http://127.0.0.1:{port}/predictions/mlp")


# ----------------------------------------------------------------------------- load


WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "%s"
local f = io.open("%s", "rb"); wrk.body = f:read("*a"); f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nRESULT {"requests": %%d, "duration_us": %%d, "socket_errors": %%d, "bad_status": %%d, '
    .. '"p50_us": %%d, "p99_us": %%d}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk(r: Running, work: Path, clients: int, duration: float) -> dict[str, float]:
    """Drive ``clients`` keep-alive connections for ``duration`` seconds; the numbers."""
    body = work / "body.bin"
    body.write_bytes(r.body)
    script = work / "post.lua"
    script.write_text(WRK_SCRIPT % (r.content_type, body))
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{duration:.0f}s", "--timeout", "10s", "-s",
         str(script), r.url],
        capture_output=True, text=True, timeout=duration + 60, check=True,
    ).stdout  # fmt: skip
    res = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    return {
        "rps": res["requests"] / (res["duration_us"] / 1e6),
        "p50_ms": res["p50_us"] / 1000,
        "p99_ms": res["p99_us"] / 1000,
        "errors": res["socket_errors"] + res["bad_status"],
        "requests": res["requests"],
    }


# ----------------------------------------------------------------------------- main


@dataclass(frozen=True)
class System:
    name: str
    peer: str | None
    start: Callable[[], Running]
    swaps: bool = False  # publish and activate versions while measured


def measure(sys_: System, work: Path, args: argparse.Namespace, rnd: int) -> dict[str, object]:
    t0 = time.monotonic()
    r = sys_.start()
    try:
        wait_ready(r)
        startup = time.monotonic() - t0
        wrk(r, work, args.clients, args.warmup)
        load = os.getloadavg()[0]
        done = threading.Event()
        swapped: list[int] = []
        swapper = threading.Thread(target=lambda: swapped.append(swap_versions(r, done)))
        if sys_.swaps:
            swapper.start()
        try:
            row = wrk(r, work, args.clients, args.duration)
        finally:
            done.set()
            if sys_.swaps:
                swapper.join()
    finally:
        stop(r)
    extra = {"swaps": swapped[0]} if swapped else {}
    return {
        "name": sys_.name, "peer": sys_.peer, **row, **extra,
        "slo_met": row["p99_ms"] <= SLO_MS and row["errors"] == 0,
        "round": rnd, "load_avg": round(load, 2), "startup_s": round(startup, 1),
        "clients": args.clients, "duration_s": args.duration,
    }  # fmt: skip


def summarise(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    by: dict[tuple[str, str | None], list[dict[str, object]]] = {}
    for r in rows:
        by.setdefault((str(r["name"]), r["peer"]), []).append(r)  # type: ignore[arg-type]
    out: list[dict[str, object]] = []
    for (name, peer), rs in by.items():
        med = {k: statistics.median(float(r[k]) for r in rs)  # type: ignore[arg-type]
               for k in ("rps", "p50_ms", "p99_ms", "load_avg")}  # fmt: skip
        errors = sum(int(r["errors"]) for r in rs)  # type: ignore[call-overload]
        out.append({"name": name, "peer": peer, **med, "errors": errors,
                    "slo_met": med["p99_ms"] <= SLO_MS and errors == 0,
                    "round": None, "rounds": len(rs)})  # fmt: skip
        if any("swaps" in r for r in rs):
            out[-1]["swaps"] = sum(int(r.get("swaps", 0)) for r in rs)  # type: ignore[call-overload]
    ref = {s["peer"]: float(s["rps"]) for s in out if s["peer"]}  # type: ignore[arg-type]
    for s in out:
        if s["peer"] is None:
            if "ray-serve" in ref:
                s["x_ray"] = round(float(s["rps"]) / ref["ray-serve"], 2)  # type: ignore[arg-type]
            if "torchserve" in ref:
                s["x_ts"] = round(float(s["rps"]) / ref["torchserve"], 2)  # type: ignore[arg-type]
            if "litserve" in ref:
                s["x_lit"] = round(float(s["rps"]) / ref["litserve"], 2)  # type: ignore[arg-type]
    return out


def table(rows: list[dict[str, object]]) -> str:
    head = f"{'system':34} {'round':>5} {'rps':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} " \
           f"{'slo':>4} {'load':>5}  ratios"  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        label = f"{r['name']} ({r['peer'] or 'coadapt'})"
        ratios = " ".join(f"{k}={r[k]}" for k in ("x_ray", "x_ts", "x_lit", "swaps") if k in r)
        lines.append(
            f"{label:34} {r['round'] if r['round'] is not None else 'med':>5} "
            f"{float(r['rps']):9.0f} {float(r['p50_ms']):8.2f} {float(r['p99_ms']):8.2f} "  # type: ignore[arg-type]
            f"{r['errors']:>6} {'yes' if r['slo_met'] else 'NO':>4} "
            f"{float(r['load_avg']):5.2f}  {ratios}"  # type: ignore[arg-type]
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="write the rows here")
    p.add_argument("--install", action="store_true", help="install wrk, Java and the peers")
    p.add_argument("--peers-venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--peers", default="ray-serve,litserve,torchserve",
                   help="comma-separated; empty for coadapt alone")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per system")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--no-netns", action="store_true", help="(set inside the namespace)")
    p.add_argument("--ctr", action="store_true", help="also run the sparse CTR section")
    p.add_argument("--ctr-only", action="store_true", help="run only the sparse CTR section")
    sys.path.insert(0, str(ROOT))
    from benchmarks.serve import ctr

    ctr.add_arguments(p)
    args = p.parse_args(argv)
    if args.install:
        return install(args.peers_venv)
    if args.ctr_only:
        ctr_rows = ctr.run(args)
        for r in ctr_rows:
            print(json.dumps(r), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"rows": ctr_rows}, indent=1))
        return 0 if ctr_rows else 1
    if shutil.which("wrk") is None:
        print("error: wrk not found: run with --install (or apt-get install wrk)", file=sys.stderr)
        return 2
    peers = [s for s in args.peers.split(",") if s]
    unknown = set(peers) - {"ray-serve", "litserve", "torchserve"}
    if unknown:
        print(f"error: unknown peers {sorted(unknown)}", file=sys.stderr)
        return 2
    if peers and not args.no_netns:  # Ray rewrites 127.0.0.1 unless loopback is all there is
        inner = " ".join(f"'{a}'" for a in [sys.executable, __file__, *(argv or sys.argv[1:]),
                                             "--no-netns"])  # fmt: skip
        return subprocess.call(["unshare", "-n", "sh", "-c", f"ip link set lo up; exec {inner}"])
    if peers and not (args.peers_venv / "bin/python").exists():
        print(f"error: no peers venv at {args.peers_venv}: run with --install", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="coadapt-serve-bench-"))
    venv = args.peers_venv
    systems = [
        System("dense-mlp-json", None, lambda: start_coadapt(work, binary=False)),
        System("dense-mlp-binary", None, lambda: start_coadapt(work, binary=True)),
        System(
            "dense-mlp-json-hotswap",
            None,
            lambda: start_coadapt(work, binary=False, store="swap"),
            swaps=True,
        ),
    ]
    starters = {
        "ray-serve": lambda: start_ray(work, venv),
        "litserve": lambda: start_litserve(work, venv),
        "torchserve": lambda: start_torchserve(work, venv),
    }
    systems += [System("dense-mlp-json", peer, starters[peer]) for peer in peers]
    print(f"{os.cpu_count()} cpus, load {os.getloadavg()}, work dir {work}", flush=True)
    rows: list[dict[str, object]] = []
    for rnd in range(args.rounds):
        order = systems[rnd % len(systems) :] + systems[: rnd % len(systems)]
        for s in order:
            try:
                row = measure(s, work, args, rnd)
            except (RuntimeError, OSError, subprocess.SubprocessError, KeyError) as exc:
                print(f"{s.name} ({s.peer or 'coadapt'}) failed: {exc}; logs in {work}",
                      file=sys.stderr, flush=True)  # fmt: skip
                continue
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    summary = summarise(rows)
    print()
    print(table(rows + summary))
    if args.ctr:
        summary += ctr.run(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows + summary}, indent=1))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
