"""The composition root assembles the whole service, and a core install runs it.

torch, scikit-learn and matplotlib are the ``train`` extra: the controller process (server,
API, dashboard, tuning) must import and serve without them. A child interpreter hides them
(as if they were not installed) and builds the service.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import httpx
from fastapi import FastAPI

from coadapt.executors import FakeExecutor
from coadapt.service import ServerOptions, build

ROOT = Path(__file__).resolve().parents[1]
TRAIN_EXTRA = ("torch", "sklearn", "matplotlib")

#: ``sys.modules[name] = None``: ``import name`` raises ModuleNotFoundError and
#: ``importlib.util.find_spec(name)`` answers None, exactly as if it were not installed.
HIDE = f"import sys\nsys.modules.update(dict.fromkeys({TRAIN_EXTRA!r}))\n"


def get(app: FastAPI, path: str, token: str | None = None) -> httpx.Response:
    """One in-process GET (httpx's ASGI transport): no server, no port, no lifespan."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(path, headers=headers)

    return anyio.run(go)


def _run_hidden(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "hidden.py"
    script.write_text(HIDE + textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_service_serves_every_router(tmp_path: Path) -> None:
    app, _controller, store = build(
        ServerOptions(state_dir=tmp_path / "state", isolation="none"),
        executor=FakeExecutor(slots=2),
    )
    try:
        token = (tmp_path / "state" / "admin-token").read_text().strip()
        assert get(app, "/healthz").json()["ok"] is True
        assert get(app, "/api/v1/jobs", token).status_code == 200
        assert get(app, "/api/v1/experiments", token).status_code == 200
        assert get(app, "/api/v1/models", token).status_code == 200
        assert get(app, "/api/v1/ui/cluster", token).status_code == 200
        assert get(app, "/api/v1/experiments").status_code == 401  # one authenticator
        schema = get(app, "/openapi.json").json()
        assert {"JobSpec", "ExperimentSpec"} <= set(schema["components"]["schemas"])
    finally:
        store.close()


def test_the_controller_runs_without_the_train_extra(tmp_path: Path) -> None:
    code = f"""
    import contextlib, io, sys
    from coadapt.cli import main
    from tests.test_service import get
    from coadapt.executors import FakeExecutor
    from coadapt.service import ServerOptions, build

    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(["server", "--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
    assert "--state-dir" in out.getvalue()
    app, _, store = build(
        ServerOptions(state_dir=__import__("pathlib").Path({str(tmp_path / "s")!r}),
                      isolation="none"),
        executor=FakeExecutor(slots=1),
    )
    assert get(app, "/healthz").status_code == 200
    store.close()
    assert main(["demo", "--out", {str(tmp_path / "demo")!r}]) == 2
    loaded = sorted(m for m in sys.modules if m.split('.')[0] in {TRAIN_EXTRA!r} and sys.modules[m])
    assert not loaded, loaded
    print("OK")
    """
    done = _run_hidden(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK")
    assert "pip install 'coadapt[train]'" in done.stdout  # the demo says what to install


def test_the_demo_jobs_are_the_examples() -> None:
    """One copy: the examples the README shows link to the files the package ships."""
    shipped = ROOT / "coadapt" / "controller" / "demo_jobs"
    from coadapt.controller.demo import DEFAULT_JOBS, EXAMPLES

    assert shipped == EXAMPLES
    files = {j.example for j in DEFAULT_JOBS}
    files |= {f.replace(".yaml", ".py") for f in files}
    for name in sorted(files):
        assert (ROOT / "examples" / name).resolve() == (shipped / name).resolve(), (
            f"examples/{name} must be a link to {shipped / name}"
        )
