"""The controller's OpenAPI schema and its documentation pages, served without a CDN.

The schema states what the API accepts and answers: the job and experiment bodies are the
JSON Schemas of the pydantic models that validate them (:class:`~coadapt.controller.spec.
JobSpec`, :class:`~coadapt.tune.spec.ExperimentSpec`), every error is the one
:class:`ErrorBody` shape, and the status codes follow from each route: a route behind the
bearer token can answer 401 (and 503 when the database is down), one with a path parameter
404, one with parameters or a body 422; 403/409/413 are declared by the routes that raise them.

Swagger UI (``/docs``) and ReDoc (``/redoc``) load their scripts from ``controller/static``
(vendored, see its README), so they work on a machine without internet access.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict

STATIC = Path(__file__).resolve().parent / "static"
STATIC_URL = "/api-docs-static"


class ErrorBody(BaseModel):
    """Every error the API returns: a code, a sentence, and per-field details."""

    model_config = ConfigDict(extra="forbid")

    error: str
    message: str
    details: list[dict[str, Any]] = []


ERRORS: dict[int, str] = {
    401: "missing or unknown API token (send Authorization: Bearer TOKEN)",
    403: "the token is valid but not allowed to do this (admin only)",
    404: "no such resource, or not the caller's (the same answer, so ids do not leak)",
    409: "the resource's state forbids the change (e.g. it already ended, or a name is taken)",
    413: "the request body is over the size limit the message names",
    422: "invalid input: details name each field, what was wrong and what it accepts",
    503: "the database cannot be reached; retry later",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each code with its meaning and the :class:`ErrorBody`."""
    return {code: {"model": ErrorBody, "description": ERRORS[code]} for code in codes}


def json_body(model: type[BaseModel], description: str) -> dict[str, Any]:
    """``openapi_extra=`` declaring a required JSON body described by ``model``'s schema.

    For routes that read the body themselves (to answer with the validator's own messages)
    and so have no body parameter FastAPI could describe.
    """
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


def _error_ref() -> dict[str, Any]:
    return {
        "description": "",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }


def _complete(schema: dict[str, Any], models: Sequence[type[BaseModel]]) -> dict[str, Any]:
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    every: list[type[BaseModel]] = [ErrorBody, *models]
    for model in every:
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            resp = op["responses"]
            implied = []
            if op.get("security"):
                implied += [401, 503]
            params = op.get("parameters", [])
            if any(p.get("in") == "path" for p in params):
                implied.append(404)
            if any(p.get("in") != "path" for p in params) or "requestBody" in op:
                implied.append(422)
            for code in implied:
                entry = resp.setdefault(str(code), _error_ref())
                entry["description"] = entry.get("description") or ERRORS[code]
                # FastAPI's default 422 body is not what the API sends: ours replaces it.
                entry["content"] = _error_ref()["content"]
    for unused in ("HTTPValidationError", "ValidationError"):
        comps.pop(unused, None)
    return schema


def install_openapi(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Replace ``app.openapi`` by one that adds ``models``, the error body and the codes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = _complete(schema, models)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` from the vendored assets."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC), name="api-docs-static")
    title = f"{app.title} API"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=title,
            swagger_js_url=f"{STATIC_URL}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_URL}/swagger-ui/favicon-32x32.png",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title=title,
            redoc_js_url=f"{STATIC_URL}/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_URL}/swagger-ui/favicon-32x32.png",
            with_google_fonts=False,
        )


__all__ = [
    "ERRORS",
    "STATIC",
    "STATIC_URL",
    "ErrorBody",
    "error_responses",
    "install_docs",
    "install_openapi",
    "json_body",
]
