"""Bad input is a 4xx that names the limit, never a 500, and never changes what is stored
(issue 13, point 5: one regression test per reported input, plus the same classes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from coadapt.cli import main as coadapt_main
from coadapt.controller.http_input import BIGINT_MAX, MAX_BODY_BYTES
from coadapt.controller.spec import MAX_ARG_CHARS, MAX_ARGS_ITEMS, MAX_ENV_VARS, MAX_SPEC_BYTES
from coadapt.controller.states import JobState
from tests.controller.conftest import make_spec
from tests.controller.test_api import Api, api, submit

__all__ = ["api"]  # the fixture, imported so pytest finds it here


def jobs_of(api: Api) -> list[dict[str, Any]]:
    resp = api.call("GET", "/api/v1/jobs", "root")
    assert resp.status_code == 200
    return list(resp.json())


@pytest.fixture
def stored(api: Api) -> Iterator[list[dict[str, Any]]]:
    """One job stored before the test; asserts afterwards that nothing stored changed."""
    submit(api)
    before = jobs_of(api)
    yield before
    assert jobs_of(api) == before


def assert_error(resp: httpx.Response, status: int, *words: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) <= {"error", "message", "details"} and body["message"]
    text = json.dumps(body)
    for w in words:
        assert w in text, (w, body)
    return dict(body)


def test_non_ascii_metrics_token_is_a_404(api: Api, stored: list[dict[str, Any]]) -> None:
    job = stored[0]["id"]
    for token in ("é", "\u2603" * 40, "%00"):
        resp = api.call("POST", f"/api/v1/jobs/{job}/metrics", None, params={"token": token})
        assert_error(resp, 404, job)


def test_non_ascii_bearer_token_is_a_401(api: Api) -> None:
    for raw in ("Bearer é".encode(), b"Bearer \xff\xfe", b"Bearer "):
        resp = api.call("GET", "/metrics", None, headers={"Authorization": raw})
        assert_error(resp, 401, "token")


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("events", {"after": str(BIGINT_MAX + 1)}, 422),
        ("events", {"after": str(BIGINT_MAX)}, 200),
        ("logs", {"offset": "99999999999999999999"}, 422),
        ("logs", {"offset": str(2**63 - 2), "limit": "1"}, 200),
        ("logs", {"attempt": "9" * 400}, 422),
        ("logs", {"rank": str(2**40)}, 422),
    ],
)
def test_integer_params_are_bounded(
    api: Api, stored: list[dict[str, Any]], tmp_path: Path, path: str, params: Any, status: int
) -> None:
    job = stored[0]["id"]
    api.store.update_job(job, 1.0, state=JobState.RUNNING, attempt=1)
    log = tmp_path / "jobs" / job / "logs" / "attempt-1.rank-0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("hello\n")
    resp = api.call("GET", f"/api/v1/jobs/{job}/{path}", "alice", params=params)
    if status == 200:
        assert resp.status_code == 200, resp.text
        if path == "logs":
            assert resp.json()["text"] == "" and resp.json()["next_offset"] == 2**63 - 2
    else:
        assert_error(resp, status, "query.")
    api.store.update_job(job, 2.0, state=JobState.PENDING, attempt=0)


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"script": None, "command": ["python", "a\x00b"]}, "command", ("NUL",)),
        ({"script": None, "command": "python a\x00b"}, "command", ("NUL",)),
        ({"args": ["--x", "\x00"]}, "args", ("NUL",)),
        ({"env": {"A": "x\x00"}}, "env", ("NUL",)),
        ({"working_dir": "/tmp/\x00"}, "working_dir", ("NUL",)),
        ({"script": "t\x00.py"}, "script", ("NUL",)),
        ({"args": ["a" * (MAX_ARG_CHARS + 1)]}, "args.0", (str(MAX_ARG_CHARS),)),
        ({"args": ["a"] * (MAX_ARGS_ITEMS + 1)}, "args", (str(MAX_ARGS_ITEMS),)),
        (
            {"env": {f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}},
            "env",
            (str(MAX_ENV_VARS),),
        ),
        ({"args": ["a" * 8000] * 10}, "spec", (str(MAX_SPEC_BYTES),)),
        ({"name": "n" * 10_000}, "name", ("letters",)),
    ],
)
def test_impossible_or_oversized_fields_are_422_naming_the_field(
    api: Api, stored: list[dict[str, Any]], overrides: Any, field: str, words: tuple[str, ...]
) -> None:
    resp = api.call("POST", "/api/v1/jobs", json=make_spec(**overrides))
    body = assert_error(resp, 422, *words)
    assert field in {d["field"] for d in body["details"]}, body


def test_a_10_mb_spec_is_a_413_naming_the_limit(api: Api, stored: list[dict[str, Any]]) -> None:
    big = make_spec(args=["x" * 1000] * 10_000)  # ~10 MB
    body = assert_error(
        api.call("POST", "/api/v1/jobs", json=big), 413, str(MAX_BODY_BYTES), "smaller"
    )
    assert body["error"] == "payload_too_large"
    # The job list stays small: nothing was stored.
    assert len(api.call("GET", "/api/v1/jobs", "root").content) < 10_000


def test_a_chunked_body_over_the_limit_is_a_413(api: Api, stored: list[dict[str, Any]]) -> None:
    """No Content-Length: the body is counted as it streams and refused past the limit."""

    async def chunks() -> Any:
        yield b'{"name": "x", "script": "t.py", "args": ["'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"]}'

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=api.client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            headers = {"Authorization": f"Bearer {api.tokens['alice']}"}
            return await c.post("/api/v1/jobs", content=chunks(), headers=headers)

    assert_error(anyio.run(go), 413, str(MAX_BODY_BYTES))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"name": "a", "script": "x", "lr": NaN}', ("NaN",)),
        (b'{"name": "a", "script": "x", "lr": 1e999}', ("float",)),
        (b"[" * 100_000, ("deeply",)),
        (b'{"name": "a",\n "script": }', ("line 2",)),
        (b'{"name": "\xff"}', ("UTF-8",)),
    ],
)
def test_bodies_must_be_strict_json(
    api: Api, stored: list[dict[str, Any]], content: bytes, words: tuple[str, ...]
) -> None:
    headers = {"Content-Type": "application/json"}
    assert_error(api.call("POST", "/api/v1/jobs", content=content, headers=headers), 422, *words)


def test_experiment_strings_reaching_argv_reject_nul(
    api: Api, stored: list[dict[str, Any]]
) -> None:
    exp = {
        "name": "e",
        "space": {"opt": {"type": "categorical", "choices": ["sgd", "a\x00b"]}},
        "objective": {"metric": "acc"},
        "max_trials": 2,
        "trial": {"script": "t.py", "working_dir": "/"},
    }
    body = assert_error(api.call("POST", "/api/v1/experiments", json=exp), 422, "NUL")
    assert body["details"][0]["field"] == "space.opt.choices"
    assert api.call("GET", "/api/v1/experiments", "root").json()["experiments"] == []


def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    assert_error(api.call("GET", "/api/v1/nope"), 404, "not_found")
    assert_error(api.call("DELETE", "/api/v1/jobs"), 405, "method_not_allowed")


# -- the CLI's spec files ---------------------------------------------------------------------
def run_submit(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    # The file is read before any request, so no controller is needed (port 9 is discard).
    code = coadapt_main(["submit", str(path), "--server", "http://127.0.0.1:9", "--retry", "0"])
    return code, capsys.readouterr().err


def test_cli_non_utf8_spec_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(b"name: job\nscript: caf\xe9.py\n")
    code, err = run_submit(spec, capsys)
    assert code == 2
    assert err.strip().count("\n") == 0, err
    assert f"{spec}:2:12: not UTF-8" in err and "0xe9" in err


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("a.yaml", "name: job\nscript: [unclosed\n", ":3:1: not valid YAML"),
        ("b.yaml", "name: job\n  bad: indent\n", ":2:6: not valid YAML"),
        ("c.json", '{"name": "job",\n "script": }', ":2:12: not valid JSON"),
    ],
)
def test_cli_syntax_errors_name_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, where: str
) -> None:
    spec = tmp_path / name
    spec.write_text(text)
    code, err = run_submit(spec, capsys)
    assert code == 2
    assert f"{spec}{where}" in err, err
